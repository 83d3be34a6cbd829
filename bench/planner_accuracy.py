"""Planner accuracy on this machine: predicted vs measured memory per rank, layout by layout.

    OMP_NUM_THREADS=1 python bench/planner_accuracy.py                # measure every layout
    OMP_NUM_THREADS=1 python bench/planner_accuracy.py --only single "ddp 2" --write
                                      # measure some; store their rows in the calibration file
    python bench/planner_accuracy.py --stored                         # no runs: the stored rows
    python bench/planner_accuracy.py --stored --repredict --write     # re-ask the planner only
    python bench/planner_accuracy.py --stored --doc docs/PLANNER.md   # the stored table -> doc

Each layout runs `train.py` for 3 steps (tiny model, 8 x 128 tokens per step) and compares the
largest rank's model states, activations and peak with the planner's prediction for the same
run (see lightning_dist/run/calibrate.py for what is compared with what). Prints a markdown table
and the error summary, and exits 1 when a category is outside its tolerance (model states 2%,
total peak 10%) or a layout failed to run.

The rows live in lightning_dist/planner/calibration.json (lightning_dist/planner/calibration.py
owns the format). `--write` replaces the stored rows of the layouts just measured (or, with
`--stored --repredict`, every stored prediction, keeping the measurements: for a planner change
that does not change what train.py does). `--doc` puts the stored rows' table between the
calibration markers of a markdown file.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightning_dist.planner import calibration, calibration_errors  # noqa: E402
from lightning_dist.run.calibrate import (  # noqa: E402
    CATEGORIES,
    LAYOUTS,
    QUANTITY,
    SOURCE,
    TOLERANCES,
    Comparison,
    compare,
    comparisons,
    repredict,
)

BEGIN, END = "<!-- calibration table: begin -->", "<!-- calibration table: end -->"


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f}"


def markdown_table(results: list[Comparison]) -> str:
    """One row per layout and category: predicted and measured MiB, and the error."""
    lines = [
        "| layout | planner's layout | category | predicted MiB | measured MiB | error |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in results:
        for cat in CATEGORIES:
            bound = TOLERANCES.get(cat)
            mark = "" if bound is None or abs(r.error(cat)) <= bound else " ✗"
            lines.append(
                f"| {r.name} | {r.label} | {cat} | {_mib(r.predicted[cat])} | "
                f"{_mib(r.measured[cat])} | {r.error(cat):+.1%}{mark} |"
            )
    return "\n".join(lines)


def summary_lines(rows: list[calibration.CalibrationRow]) -> list[str]:
    """The error summary by category (median and largest |error| over the layouts)."""
    out = []
    for cat in CATEGORIES:
        selected = calibration_errors.select(rows, source=SOURCE, quantity=QUANTITY[cat])
        if selected:
            out.append(f"  {cat}: {calibration_errors.error_summary(selected)}")
    return out


def write_table(path: Path, table: str) -> None:
    """Replace the table between the BEGIN and END markers of `path`."""
    text = path.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path} has no {BEGIN} ... {END} markers")
    path.write_text(pattern.sub(lambda _: f"{BEGIN}\n{table}\n{END}", text))


def measure_layouts(names) -> tuple[list[Comparison], list[str]]:
    results, errors = [], []
    for name in names:
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
    return results, errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(LAYOUTS), help="layouts to run")
    parser.add_argument(
        "--stored",
        action="store_true",
        help="run nothing: use the rows stored in the calibration file",
    )
    parser.add_argument(
        "--repredict",
        action="store_true",
        help="with --stored: ask the planner again, keep the measured values",
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help="store the rows in the calibration file (replacing those layouts')",
    )
    parser.add_argument(
        "--rows",
        type=Path,
        default=calibration.PATH,
        help=f"the calibration file (default {calibration.PATH})",
    )
    parser.add_argument(
        "--doc", type=Path, help="put the stored rows' table into this markdown file"
    )
    args = parser.parse_args(argv)
    if args.repredict and not args.stored:
        parser.error("--repredict re-asks the planner for stored rows: add --stored")
    if args.stored and args.only:
        parser.error("--stored runs nothing; --only picks layouts to run")

    stored = calibration.load(args.rows) if args.rows.exists() else calibration.Calibration()
    errors: list[str] = []
    if args.stored:
        rows = list(stored.rows)
        if args.repredict:
            rows = repredict(rows)
        results = comparisons(rows)
    else:
        results, errors = measure_layouts(args.only or LAYOUTS)
        rows = [row for r in results for row in r.rows()]

    print(markdown_table(results))
    failures = [f for r in results for f in r.failures()]
    bounds = ", ".join(f"{c} {t:.0%}" for c, t in TOLERANCES.items())
    print(f"\n{len(results)} layouts, {len(failures)} outside tolerance ({bounds})")
    for line in failures + errors:
        print(f"  {line}")
    print("error summary (|predicted / measured - 1|):")
    print("\n".join(summary_lines(rows)))

    if args.write:
        stored = stored.with_rows(rows)
        calibration.save(stored, args.rows)
        print(f"wrote {len(rows)} rows to {args.rows} ({len(stored.rows)} stored)")
    if args.doc:
        write_table(args.doc, markdown_table(comparisons(stored.rows)))
    return 1 if failures or errors else 0


if __name__ == "__main__":
    sys.exit(main())
