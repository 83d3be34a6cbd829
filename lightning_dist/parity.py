"""Parity harness: does a strategy/layout compute the same losses as a single process?

    python -m lightning_dist.parity strategy=ddp hardware.devices=2 model=llama_debug data=synthetic

runs `train.py` twice — the reference (the same overrides with `strategy=single
hardware.devices=1`) and the candidate — prints the per-step losses side by side with the
largest relative difference, and exits 1 when that difference is above `--tolerance`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from lightning_dist.run.parity_runs import compare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_dist.parity",
        description="Compare a strategy's per-step losses with a single process.",
    )
    parser.add_argument("overrides", nargs="+", help="train.py overrides of the candidate run")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=1e-4,
        help="largest relative loss difference allowed (default 1e-4, fp32)",
    )
    parser.add_argument("--workdir", default=None, help="keep both run directories here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="parity-") as tmp:
        try:
            diff, table = compare(
                args.overrides, tolerance=args.tolerance, workdir=args.workdir or tmp
            )
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    print(table)
    return 0 if diff <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
