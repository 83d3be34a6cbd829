"""Interval arithmetic for profiler timelines: unions, lengths and differences."""

from __future__ import annotations

Interval = tuple[float, float]


def union_of(intervals: list[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering exactly the same points."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def union_length(intervals: list[Interval]) -> float:
    return sum(e - s for s, e in union_of(intervals))


def subtract(intervals: list[Interval], holes: list[Interval]) -> list[Interval]:
    """The parts of `intervals` not covered by `holes` (both as given by `union_of`)."""
    out: list[Interval] = []
    holes = union_of(holes)
    for start, end in union_of(intervals):
        cursor = start
        for h_start, h_end in holes:
            if h_end <= cursor or h_start >= end:
                continue
            if h_start > cursor:
                out.append((cursor, h_start))
            cursor = max(cursor, h_end)
        if cursor < end:
            out.append((cursor, end))
    return out
