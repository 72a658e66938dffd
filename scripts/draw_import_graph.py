"""Draw the import graph between the package's layers (docs/import_graph.png) and print it as a Markdown table.

    python scripts/draw_import_graph.py [--out docs/import_graph.png]

The layers and the import reader are the layering test's (tests/unit/test_layering.py), so the picture shows what the
test enforces: every arrow points to a lower row.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_layering():
    spec = importlib.util.spec_from_file_location("test_layering", ROOT / "tests" / "unit" / "test_layering.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def package_edges(layering) -> dict[tuple[str, str], int]:
    """(importer package, imported package) -> number of module-to-module imports, function-level ones included."""
    modules = layering.all_modules()
    edges: dict[tuple[str, str], int] = defaultdict(int)
    for name, path in modules.items():
        _, pkg = layering.layer_of(name)
        for imp in layering.imports(path, module_level_only=False):
            target = layering.internal(imp, modules) if imp.startswith("sglang_prorsa") else None
            if target is None or target == name or name.startswith(target + "."):
                continue
            _, t_pkg = layering.layer_of(target)
            if t_pkg != pkg:
                edges[(pkg, t_pkg)] += 1
    return edges


def short(pkg: str) -> str:
    return pkg.removeprefix("sglang_prorsa.") if pkg != "sglang_prorsa" else "sglang_prorsa (root)"


def draw(layering, edges: dict[tuple[str, str], int], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = layering.LAYERS
    pos: dict[str, tuple[float, float]] = {}
    for rank, line in enumerate(layers):
        for i, pkg in enumerate(line):
            pos[pkg] = ((i + 1) / (len(line) + 1), rank)
    fig, ax = plt.subplots(figsize=(11, 0.62 * len(layers) + 1))
    for (a, b), n in edges.items():
        (xa, ya), (xb, yb) = pos[a], pos[b]
        ax.annotate("", xy=(xb, yb + 0.18), xytext=(xa, ya - 0.18),
                    arrowprops=dict(arrowstyle="->", color="tab:blue", alpha=0.35, lw=0.6 + 0.15 * min(n, 10),
                                    connectionstyle="arc3,rad=0.08"))
    for pkg, (x, y) in pos.items():
        ax.text(x, y, short(pkg), ha="center", va="center", fontsize=8,
                bbox=dict(boxstyle="round,pad=0.3", fc="lightyellow" if "policy" in pkg else "white", ec="grey"))
    ax.set_ylim(-0.7, len(layers) - 0.3)
    ax.set_xlim(0, 1)
    ax.axis("off")
    ax.set_title("Imports between packages (function-level included): every arrow points down; policy is shaded")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "import_graph.png")
    args = parser.parse_args()
    layering = load_layering()
    edges = package_edges(layering)
    upward = layering.upward_imports(layering.all_modules())
    print("| layer (bottom first) | package | imports (number of module imports) |")
    print("| --- | --- | --- |")
    for rank, line in enumerate(layering.LAYERS):
        for pkg in line:
            targets = sorted((b, n) for (a, b), n in edges.items() if a == pkg)
            print(f"| {rank} | `{short(pkg)}` | " + (", ".join(f"{short(b)} ({n})" for b, n in targets) or "-") + " |")
    print(f"\nupward imports: {len(upward)}")
    draw(layering, edges, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
