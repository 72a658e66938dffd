"""Write the held-out family of workload settings (sglang_prorsa/workload/family.py) as data.

    PYTHONSAFEPATH=1 PYTHONPATH=. python benchmarks/make_forecast_settings.py --seed 34 --count 60 \
        [--out benchmarks/forecast_settings.json]

Deterministic: the same seed and count give the same file, byte for byte (tests/unit/workload/
test_forecast_settings.py checks the committed file against this script). Each entry holds its id, its own seed and
every parameter; ``benchmarks/bench_forecast_heldout.py`` replays them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglang_prorsa.workload.family import DIMENSIONS, FAMILY_VERSION, draw_settings

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "forecast_settings.json"


def document(seed: int, count: int) -> dict:
    return {
        "generator": "benchmarks/make_forecast_settings.py",
        "seed": seed,
        "count": count,
        "family_version": FAMILY_VERSION,
        "dimensions": {name: list(values) for name, (values, _) in DIMENSIONS.items()},
        "settings": draw_settings(seed, count),
    }


def render(doc: dict) -> str:
    """One setting per line: a readable, diff-friendly file."""
    one = lambda value: json.dumps(value, separators=(", ", ": "))  # noqa: E731
    head = [f" {json.dumps(k)}: {one(v)}" for k, v in doc.items() if k not in ("dimensions", "settings")]
    dims = [f"  {json.dumps(k)}: {one(v)}" for k, v in doc["dimensions"].items()]
    rows = [f"  {one(s)}" for s in doc["settings"]]
    body = ("{\n" + ",\n".join(head) + ',\n "dimensions": {\n' + ",\n".join(dims) + '\n },\n "settings": [\n'
            + ",\n".join(rows) + "\n ]\n}\n")
    assert json.loads(body) == doc
    return body


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.count < 1:
        parser.error("--count must be >= 1")
    text = render(document(args.seed, args.count))
    args.out.write_text(text)
    print(f"wrote {len(json.loads(text)['settings'])} settings to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
