"""Turn a finished run into PNG plots and a markdown summary, without W&B.

    python -m lightning_dist.report outputs/tiny-ddp-cpu

reads the run directory's `metrics/metrics.csv` and `summary.json` and writes `report/*.png` and
`report/README.md` into it (or into `--out`). Every plot's title names the run, and its x axis
counts optimizer steps as the console and summary.json do (the CSV's Lightning step + 1, see
`lightning_dist.runtime.record`). The report is as private as the run directory: of a private
one (`paths.private=true`, mode 0700) its folder is 0700 and its files 0600, whatever the umask.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightning_dist.run.report_pages import write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_dist.report", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="a train.py run directory (has summary.json)")
    parser.add_argument("--out", type=Path, default=None, help="default: RUN_DIR/report")
    args = parser.parse_args(argv)
    if not (args.run_dir / "summary.json").exists():
        print(
            f"error: {args.run_dir} has no summary.json; is it a finished train.py run?",
            file=sys.stderr,
        )
        return 2
    out = args.out or args.run_dir / "report"
    written = write_report(args.run_dir, out)
    print(f"wrote {len(written)} plots and README.md to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
