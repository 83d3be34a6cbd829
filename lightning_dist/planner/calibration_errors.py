"""Errors of calibration rows: selecting rows, summarising their errors, the targets the
planner is held to and the table `python -m lightning_dist.calibration_report` prints. The rows
and their file are `planner/calibration.py`'s."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, fields

from lightning_dist.planner.calibration import QUANTITIES, CalibrationRow


def select(rows: Iterable[CalibrationRow], **criteria) -> list[CalibrationRow]:
    """The rows whose fields match every criterion: `select(rows, source="measured-cpu",
    quantity=("memory.total_bytes", "memory.model_states_bytes"))`. A value that is a tuple,
    list or set matches any of its members."""
    names = {f.name for f in fields(CalibrationRow)}
    for name in criteria:
        if name not in names:
            raise ValueError(f"select: {name!r} is not a row field ({', '.join(sorted(names))})")

    def matches(row: CalibrationRow) -> bool:
        for name, want in criteria.items():
            value = getattr(row, name)
            if isinstance(want, tuple | list | set | frozenset):
                if value not in want:
                    return False
            elif value != want:
                return False
        return True

    return [r for r in rows if matches(r)]


@dataclass(frozen=True)
class ErrorSummary:
    """Relative errors (predicted / measured - 1) of some rows."""

    count: int
    median: float
    """Median of |error|."""
    max: float
    """Largest |error|."""
    worst: CalibrationRow
    """The row with the largest |error|."""

    def __str__(self) -> str:
        return (
            f"{self.count} rows, median |error| {self.median:.1%}, max {self.max:.1%} "
            f"({self.worst.layout}: {self.worst.error:+.1%})"
        )


def error_summary(rows: Iterable[CalibrationRow]) -> ErrorSummary:
    """Median and largest relative error over the rows that have a prediction."""
    errors = {id(r): (r, abs(r.error)) for r in rows if r.error is not None}
    if not errors:
        raise ValueError("error_summary: no row has a prediction")
    sizes = [size for _, size in errors.values()]
    worst = max(errors.values(), key=lambda pair: pair[1])[0]
    return ErrorSummary(len(sizes), statistics.median(sizes), max(sizes), worst)


def summarize(rows: Iterable[CalibrationRow]) -> dict[tuple[str, str], ErrorSummary]:
    """error_summary per (source, quantity), in the order the rows first name them."""
    groups: dict[tuple[str, str], list[CalibrationRow]] = {}
    for r in rows:
        if r.predicted is not None:
            groups.setdefault((r.source, r.quantity), []).append(r)
    return {k: error_summary(v) for k, v in groups.items()}


# --- the command line ------------------------------------------------------------------------

TARGETS = {
    # (source, quantity): the largest |error| the planner is held to (tests/unit pins them)
    ("published", "time.tokens_per_sec_per_device"): 0.15,
    ("published", "memory.process_bytes"): 0.10,
    ("published", "memory.reserved_bytes"): 0.10,
    ("published", "time.hfu"): 0.05,  # points of peak, not relative
}


def row_error(row: CalibrationRow) -> float | None:
    """The row's error as its target counts it: points of peak for `time.hfu`, else relative."""
    if row.predicted is None:
        return None
    if row.quantity == "time.hfu":
        return row.predicted - row.measured
    return row.error


def _value(quantity: str, value: float | None) -> str:
    if value is None:
        return "-"
    unit = QUANTITIES[quantity][0]
    if unit == "bytes":
        return f"{value / 2**30:.2f} GiB"
    if unit == "fraction":
        return f"{100 * value:.1f}%"
    if unit == "tokens/s":
        return f"{value:,.0f}"
    return f"{value:.4g}"


def table(rows: Iterable[CalibrationRow]) -> str:
    """Each row: predicted, measured (or published), error, and whether it meets its target."""
    lines = [
        "| source | model | hardware | layout | quantity | predicted | measured | error | target |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        error, target = row_error(r), TARGETS.get((r.source, r.quantity))
        if error is None:
            shown = "-"
        elif r.quantity == "time.hfu":
            shown = f"{100 * error:+.1f} pt"
        else:
            shown = f"{error:+.1%}"
        met = (
            "" if target is None or error is None else ("met" if abs(error) <= target else "MISSED")
        )
        lines.append(
            f"| {r.source} | {r.model} | {r.hardware} | {r.layout} | {r.quantity} | "
            f"{_value(r.quantity, r.predicted)} | {_value(r.quantity, r.measured)} | {shown} | {met} |"
        )
    return "\n".join(lines)
