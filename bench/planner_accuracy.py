"""Planner accuracy on this machine: predicted vs measured memory per rank, layout by layout.

    OMP_NUM_THREADS=1 python bench/planner_accuracy.py                 # every layout (~3 min)
    python bench/planner_accuracy.py --only single "ddp 2"            # some of them
    python bench/planner_accuracy.py --write docs/PLANNER.md           # refresh the doc's table

Each layout runs `train.py` for 3 steps (tiny model, 8 x 128 tokens per step) and compares the
largest rank's model states, activations and peak with the planner's prediction for the same
run (see lightning_dist/run/calibrate.py for what is compared with what). Prints a markdown table
and exits 1 when a category is outside its tolerance (model states 2%, total peak 10%).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightning_dist.run.calibrate import LAYOUTS, TOLERANCES, compare, markdown_table  # noqa: E402

BEGIN, END = "<!-- calibration table: begin -->", "<!-- calibration table: end -->"


def write_table(path: Path, table: str) -> None:
    """Replace the table between the BEGIN and END markers of `path`."""
    text = path.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path} has no {BEGIN} ... {END} markers")
    path.write_text(pattern.sub(lambda _: f"{BEGIN}\n{table}\n{END}", text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(LAYOUTS), help="layouts to run")
    parser.add_argument("--write", type=Path, help="put the table into this markdown file")
    args = parser.parse_args(argv)
    results, errors = [], []
    for name in args.only or LAYOUTS:
        started = time.perf_counter()
        try:
            result = compare(name)
        except RuntimeError as e:  # a strategy that does not run here yet: report, go on
            errors.append(f"{name}: {str(e).splitlines()[0]}")
            print(f"{name}: FAILED to run", file=sys.stderr)
            continue
        results.append(result)
        errs = ", ".join(f"{c} {result.error(c):+.1%}" for c in result.predicted)
        print(f"{name}: {errs} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    table = markdown_table(results)
    print(table)
    failures = [f for r in results for f in r.failures()]
    bounds = ", ".join(f"{c} {t:.0%}" for c, t in TOLERANCES.items())
    print(f"\n{len(results)} layouts, {len(failures)} outside tolerance ({bounds})")
    for line in failures + errors:
        print(f"  {line}")
    if args.write:
        write_table(args.write, table)
    return 1 if failures or errors else 0


if __name__ == "__main__":
    sys.exit(main())
