"""Calibration: the one owner of every measured number the planner is checked against or reads.

One file, `calibration.json` next to this module, holds

- **rows**: one measured or published quantity of one run, with the planner's prediction for
  that run when the row was recorded. Two sources hold rows today: "measured-cpu", the CPU
  memory rows (model states, activations, tensor peak, process peak) that
  `bench/planner_accuracy.py` measures with `train.py`, and "published", rows from papers and
  reports (tokens/s per device, hardware FLOP utilisation, reserved memory), each citing its
  `origin`. GPU runs ("measured-gpu") take the same form; none is stored yet;
- **corrections**: the constants of the cost model that were fitted to rows, each naming the
  rows it came from and how: the CPU framework reserve (fitted to the "measured-cpu" process
  and tensor peaks) and the GPU time model's constants (fitted to the "published" time rows by
  `bench/fit_time_model.py`).

The format is versioned JSON (FORMAT, VERSION); `load` validates every field and refuses bad
input with a ValueError that names the file, the row and the field. docs/PLANNER.md
("Calibration") describes the file and how to refresh it.

Plain Python like the rest of the planner, and below it: this module imports nothing from
lightning_dist, so `settings.py` can read its corrections without a cycle.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
from collections.abc import Iterable
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path

FORMAT = "lightning_dist.calibration"
VERSION = 1
PATH = Path(__file__).with_name("calibration.json")
"""The stored file (package data)."""

SOURCES = {
    "measured-cpu": "measured here, on the CPU, by running train.py",
    "measured-gpu": "measured by running train.py on GPUs",
    "published": "a published run (paper, report); `origin` cites it",
}

QUANTITIES = {
    # name: (unit, what is measured; the planner's counterpart)
    "memory.model_states_bytes": (
        "bytes",
        "params + grads + optimizer state of the largest rank after the step; "
        "MemoryBreakdown.params + grads + optimizer",
    ),
    "memory.activations_bytes": (
        "bytes",
        "high-water mark of tensors created in forward, largest rank; MemoryBreakdown.activations",
    ),
    "memory.total_bytes": (
        "bytes",
        "the step's peak of live tensors, largest rank (MemTracker on a CPU, "
        "torch.cuda.max_memory_allocated on a GPU); MemoryBreakdown.tensors (no reserve)",
    ),
    "memory.process_bytes": (
        "bytes",
        "the process's peak memory, largest rank (resident set on a CPU, device memory the "
        "process holds on a GPU); MemoryBreakdown.total (with the reserve)",
    ),
    "memory.reserved_bytes": (
        "bytes",
        "the CUDA caching allocator's peak reserved memory, largest rank "
        "(torch.cuda.max_memory_reserved: what torchtitan logs; no CUDA context or NCCL "
        "buffers); MemoryBreakdown.reserved (tensors + allocator)",
    ),
    "time.step_seconds": ("seconds", "wall time of one optimizer step; StepTime.step_seconds"),
    "time.mfu": ("fraction", "model FLOPs utilisation, 0-1; StepTime.mfu"),
    "time.tokens_per_sec_per_device": (
        "tokens/s",
        "training tokens per second per device; StepTime.tokens_per_sec / world size",
    ),
    "time.hfu": (
        "fraction",
        "FLOPs executed per second, recomputation included, over the peak, 0-1 (Megatron-LM's "
        "'percentage of theoretical peak'); the paper's FLOPs over StepTime.step_seconds",
    ),
}


@dataclass(frozen=True, kw_only=True)
class CalibrationRow:
    """One measured or published quantity of one run, and the planner's prediction for it."""

    source: str
    """One of SOURCES."""
    quantity: str
    """One of QUANTITIES (its unit is QUANTITIES[quantity][0])."""
    measured: float
    """The measured (or published) value, in the quantity's unit."""
    predicted: float | None
    """The planner's prediction for the same run when the row was recorded; None when the
    planner was not asked (a published row transcribed before the planner could run it)."""
    model: str
    """The model: a conf/model name ("tiny") or the paper's name ("Llama 3 405B")."""
    hardware: str
    """The machine: a conf/hardware name ("cpu") or a description ("16,384 H100 80GB")."""
    layout: str
    """The run's name for its layout ("ddp 2", "tp 8 x pp 16 x dp 128")."""
    overrides: tuple[str, ...] = ()
    """train.py overrides that reproduce the run (empty for a published row)."""
    planner_layout: str = ""
    """The planner's description of the layout (`Candidate.describe()`) when recorded."""
    precision: str
    """Lightning precision of the run ("32-true", "bf16-mixed")."""
    seq_len: int | None = None
    """Tokens per sequence."""
    global_batch_size: int | None = None
    """Sequences per optimizer step."""
    origin: str
    """Where the value came from: the command that measured it, or the citation."""
    date: str
    """When it was measured or published, YYYY-MM-DD."""
    notes: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.overrides, list):
            object.__setattr__(self, "overrides", tuple(self.overrides))
        _check_row(self.as_dict(), f"row ({self.describe()})")

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured, or None without a prediction."""
        return None if self.predicted is None else self.predicted / self.measured - 1.0

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """What makes a row unique in the file (two runs that differ in anything else, such as
        the batch, have different layout names)."""
        return (self.source, self.hardware, self.model, self.layout, self.quantity)

    def describe(self) -> str:
        return f"{self.source} {self.layout!r} {self.quantity}"

    def as_dict(self) -> dict:
        out = asdict(self)
        if isinstance(self.overrides, tuple):
            out["overrides"] = list(self.overrides)
        return out


@dataclass(frozen=True, kw_only=True)
class Correction:
    """A cost-model constant fitted to rows of this file."""

    name: str
    """What the planner calls it ("reserve_bytes": settings.RESERVE_BYTES)."""
    accelerator: str
    """The hardware kind it applies to ("cpu", "gpu")."""
    value: float
    unit: str
    fitted_to: str
    """The rows it was fitted to, as "<source> <quantity>"."""
    method: str
    """How the value follows from those rows."""
    date: str
    """When it was fitted, or last checked against its rows, YYYY-MM-DD."""

    def __post_init__(self) -> None:
        _check_correction(self.as_dict(), f"correction {self.name!r}")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Calibration:
    """The whole file: its rows and corrections."""

    rows: tuple[CalibrationRow, ...] = ()
    corrections: tuple[Correction, ...] = field(default=())

    def correction(self, name: str, accelerator: str) -> float:
        for c in self.corrections:
            if (c.name, c.accelerator) == (name, accelerator):
                return c.value
        raise KeyError(f"no calibration correction {name!r} for {accelerator!r}")

    def with_rows(self, new: Iterable[CalibrationRow]) -> Calibration:
        """A copy where `new` replaces the stored rows with the same key; others are kept, in
        order, and rows with a new key are appended."""
        new = list(new)
        by_key = {r.key: r for r in new}
        kept = [by_key.pop(r.key, r) for r in self.rows]
        return replace(self, rows=tuple(kept + [r for r in new if r.key in by_key]))


# --- validation ----------------------------------------------------------------------------


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _check_date(v) -> bool:
    try:
        datetime.date.fromisoformat(v)
    except (TypeError, ValueError):
        return False
    return len(v) == 10


_ROW_CHECKS = {
    "source": (lambda v: v in SOURCES, f"one of {', '.join(SOURCES)}"),
    "quantity": (lambda v: v in QUANTITIES, f"one of {', '.join(QUANTITIES)}"),
    "measured": (lambda v: _is_number(v) and v > 0, "a positive finite number"),
    "predicted": (lambda v: v is None or (_is_number(v) and v >= 0), "null or a number >= 0"),
    "model": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "hardware": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "layout": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "overrides": (
        lambda v: isinstance(v, list) and all(isinstance(o, str) and "=" in o for o in v),
        "a list of 'key=value' strings",
    ),
    "planner_layout": (lambda v: isinstance(v, str), "a string"),
    "precision": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "seq_len": (
        lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0),
        "null or a positive integer",
    ),
    "global_batch_size": (
        lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0),
        "null or a positive integer",
    ),
    "origin": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "date": (_check_date, "a date YYYY-MM-DD"),
    "notes": (lambda v: isinstance(v, str), "a string"),
}

_CORRECTION_CHECKS = {
    "name": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "accelerator": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "value": (_is_number, "a finite number"),
    "unit": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "fitted_to": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "method": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "date": (_check_date, "a date YYYY-MM-DD"),
}


def _check(cls, checks: dict, entry, where: str) -> None:
    """ValueError naming `where` and the field unless `entry` has exactly the fields of `cls`
    (the defaulted ones may be left out), each as `checks` wants it."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected an object, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(checks))
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(checks)})")
    required = [
        f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
    ]
    missing = [n for n in required if n not in entry]
    if missing:
        raise ValueError(f"{where}: field {missing[0]!r} is missing")
    for name, value in entry.items():
        ok, expected = checks[name]
        if not ok(value):
            raise ValueError(f"{where}: field {name!r} must be {expected}, got {value!r}")


def _check_row(entry, where: str) -> None:
    _check(CalibrationRow, _ROW_CHECKS, entry, where)
    if QUANTITIES[entry["quantity"]][0] == "fraction" and entry["measured"] > 1:
        raise ValueError(
            f"{where}: field 'measured' must be a fraction <= 1 for {entry['quantity']}, "
            f"got {entry['measured']!r}"
        )


def _check_correction(entry, where: str) -> None:
    _check(Correction, _CORRECTION_CHECKS, entry, where)


def _parse_entry(cls, check, entry, where: str):
    """`cls(**entry)` after `check(entry, where)`."""
    check(entry, where)
    kwargs = dict(entry)
    if "overrides" in kwargs:
        kwargs["overrides"] = tuple(kwargs["overrides"])
    return cls(**kwargs)


def _describe_entry(entry) -> str:
    if not isinstance(entry, dict):
        return ""
    parts = [
        repr(entry[k]) if k == "layout" else str(entry[k])
        for k in ("source", "layout", "quantity")
        if k in entry
    ]
    return f" ({' '.join(parts)})" if parts else ""


def parse(data, where: str = "calibration") -> Calibration:
    """The Calibration a loaded JSON document describes; ValueError naming `where`, the row
    (index and what it is) and the field on any bad input."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise ValueError(f"{where}: field 'format' must be {FORMAT!r}, got {data.get('format')!r}")
    if data.get("version") != VERSION:
        raise ValueError(
            f"{where}: version {data.get('version')!r} is not supported (this code reads "
            f"version {VERSION})"
        )
    unknown = sorted(set(data) - {"format", "version", "rows", "corrections"})
    if unknown:
        raise ValueError(f"{where}: unknown top-level field {unknown[0]!r}")
    for part in ("rows", "corrections"):
        if not isinstance(data.get(part, []), list):
            raise ValueError(f"{where}: field {part!r} must be a list")
    rows = tuple(
        _parse_entry(CalibrationRow, _check_row, entry, f"{where}: row {i}{_describe_entry(entry)}")
        for i, entry in enumerate(data.get("rows", []))
    )
    seen: dict[tuple, int] = {}
    for i, row in enumerate(rows):
        if row.key in seen:
            raise ValueError(
                f"{where}: row {i} ({row.describe()}) repeats row {seen[row.key]} (same source, "
                "hardware, model, layout and quantity)"
            )
        seen[row.key] = i
    corrections = tuple(
        _parse_entry(Correction, _check_correction, entry, f"{where}: correction {i}")
        for i, entry in enumerate(data.get("corrections", []))
    )
    pairs = [(c.name, c.accelerator) for c in corrections]
    for i, pair in enumerate(pairs):
        if pair in pairs[:i]:
            raise ValueError(f"{where}: correction {i} repeats {pair[0]!r} for {pair[1]!r}")
    return Calibration(rows, corrections)


def load(path: str | Path = PATH) -> Calibration:
    """Read and validate a calibration file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from e
    return parse(data, str(path))


@functools.cache
def stored() -> Calibration:
    """The calibration file next to this module, read once (`save` to it clears the cache)."""
    return load(PATH)


def correction(name: str, accelerator: str) -> float:
    """A correction of the stored file (what the planner's constants read)."""
    return stored().correction(name, accelerator)


def dumps(calibration: Calibration) -> str:
    """The file's text: one row (and one correction) per line, so that a refresh diffs by row."""

    def block(items) -> str:
        if not items:
            return "[]"
        lines = ",\n".join("    " + json.dumps(i.as_dict(), ensure_ascii=False) for i in items)
        return "[\n" + lines + "\n  ]"

    return (
        "{\n"
        f'  "format": {json.dumps(FORMAT)},\n'
        f'  "version": {VERSION},\n'
        f'  "corrections": {block(calibration.corrections)},\n'
        f'  "rows": {block(calibration.rows)}\n'
        "}\n"
    )


def save(calibration: Calibration, path: str | Path = PATH) -> None:
    """Validate `calibration` (as `load` would read it back) and write it to `path`."""
    text = dumps(calibration)
    parse(json.loads(text), str(path))
    Path(path).write_text(text)
    if Path(path).resolve() == PATH.resolve():
        stored.cache_clear()
