"""``python -m sglang_prorsa.srt.instance --spec FILE``: one engine instance, as a front starts it."""

from __future__ import annotations

import argparse
import logging

from sglang_prorsa.config import InstanceSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True, help="the InstanceSpec JSON a front wrote")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s prorsa] %(message)s", datefmt="%H:%M:%S")
    from sglang_prorsa.srt.instance.server import run_instance

    run_instance(InstanceSpec.load(args.spec))


if __name__ == "__main__":
    main()
