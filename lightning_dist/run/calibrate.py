"""Calibration runs: the planner's memory per rank against what `train.py` measures here.

For each layout it runs `train.py` (a few steps; `MemoryByCategory` measures step 2 on every
rank with torch's MemTracker) and asks the planner for the same run through
`preflight.estimate_run`, the path `plan.check` takes. Like is compared with like:

- **model states** = params + grads + optimizer, counted from the tensors after the step;
- **activations** = the high-water mark of tensors created in forward (the planner's
  `activations`);
- **total** = the step's peak of live tensor bytes. MemTracker sees tensors, not the process,
  so the planner's side is `MemoryBreakdown.tensors`: its total without the framework reserve
  (the runtime itself on a CPU; the CUDA context, NCCL and allocator slack on a GPU);
- **process** = the process's peak resident memory against the planner's total with the
  reserve: no tolerance, it shows how far the reserve is from what the runtime costs here.

Every measured number is the largest over the ranks, as the planner predicts the worst rank.
This module only measures: a `Comparison` becomes rows of the calibration owner
(`lightning_dist.planner.calibration`, one row per category, quantity QUANTITY[category]) and
is rebuilt from them; `bench/planner_accuracy.py` prints the table from rows and stores them in
`lightning_dist/planner/calibration.json`; docs/PLANNER.md holds the last table.
"""

from __future__ import annotations

import datetime
import shlex
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from lightning_dist.planner.calibration import CalibrationRow

COMMON = (
    "model=tiny",
    "data=synthetic",
    "data.seq_len=128",
    "data.global_batch_size=8",
    "logger=none",
    "callbacks=none",
    "trainer.max_steps=3",
    "trainer.val_check_interval=null",
)
"""A model and batch where activations are a large share of the peak (about 2/3 on one rank)."""

LAYOUTS: dict[str, tuple[str, ...]] = {
    "single": ("strategy=single", "hardware.devices=1"),
    "ddp 2": ("strategy=ddp", "hardware.devices=2"),
    "fsdp FULL_SHARD 2": ("strategy=fsdp", "strategy.sharding_strategy=FULL_SHARD",
                          "hardware.devices=2"),
    "fsdp SHARD_GRAD_OP 2": ("strategy=fsdp", "strategy.sharding_strategy=SHARD_GRAD_OP",
                             "hardware.devices=2"),
    "fsdp HYBRID_SHARD 2x2": ("strategy=fsdp", "strategy.sharding_strategy=HYBRID_SHARD",
                              "strategy.hybrid_shard_size=2", "hardware.devices=4"),
    "fsdp2 reshard 2": ("strategy=fsdp2", "hardware.devices=2"),
    "fsdp2 no reshard 2": ("strategy=fsdp2", "strategy.reshard_after_forward=false",
                           "hardware.devices=2"),
    "tp 2": ("strategy=tp", "hardware.devices=2", "strategy.sequence_parallel=false"),
    "tp 2 + SP": ("strategy=tp", "hardware.devices=2", "strategy.sequence_parallel=true"),
    "tp 2 + SP, chunked loss": ("strategy=tp", "hardware.devices=2",
                                "strategy.sequence_parallel=true", "model.loss_chunk_tokens=256"),
    "single, chunked loss": ("strategy=single", "hardware.devices=1",
                             "model.loss_chunk_tokens=256"),
    "pp 2 (1F1B, 4 mb)": ("strategy=pp", "hardware.devices=2"),
    "3d dp2 x tp2 x pp2": ("strategy=3d", "strategy.tp=2", "strategy.pp=2",
                           "hardware.devices=8"),
    "3d 1, AC full": ("strategy=3d", "hardware.devices=1", "strategy.activation_checkpointing=full"),
    "3d 1, AC every 2": ("strategy=3d", "hardware.devices=1",
                         "strategy.activation_checkpointing=2"),
    "3d 1, AC op": ("strategy=3d", "hardware.devices=1", "strategy.activation_checkpointing=op"),
    "tp 2 + SP, AC op": ("strategy=tp", "hardware.devices=2", "strategy.sequence_parallel=true",
                         "strategy.activation_checkpointing=op"),
    "3d 1, AC op_alternate": ("strategy=3d", "hardware.devices=1",
                              "strategy.activation_checkpointing=op_alternate"),
}  # fmt: skip
"""Name -> the overrides that select the layout (on top of COMMON)."""

CHEAP = ("single", "ddp 2", "fsdp FULL_SHARD 2", "3d 1, AC every 2", "3d 1, AC op")
"""The layouts the slow test runs (one process each for the checkpointing choices; `3d 1, AC
full` is left out because its activations are under 0.35 of the peak, below the sanity bound)."""

CATEGORIES = ("model states", "activations", "total", "process")
"""What each layout compares; `process` (peak RSS against the total with the reserve) only
shows the reserve: RSS also holds the libraries, the Python heap and freed-but-kept pages."""

TOLERANCES = {"model states": 0.02, "total": 0.10}
"""Largest relative error allowed, by category (the planner issue's acceptance line)."""


QUANTITY = {
    "model states": "memory.model_states_bytes",
    "activations": "memory.activations_bytes",
    "total": "memory.total_bytes",
    "process": "memory.process_bytes",
}
"""Category -> the calibration quantity its rows carry (see calibration.QUANTITIES)."""

SOURCE, HARDWARE = "measured-cpu", "cpu"


@dataclass(frozen=True)
class Comparison:
    """One layout: predicted and measured bytes by category (see CATEGORIES)."""

    name: str
    label: str
    """The planner's description of the layout."""
    predicted: dict[str, float]
    measured: dict[str, float]
    overrides: tuple[str, ...] = ()
    """The train.py overrides of the run (COMMON + the layout's)."""
    precision: str = ""
    seq_len: int | None = None
    global_batch_size: int | None = None

    def error(self, category: str) -> float:
        """(predicted - measured) / measured."""
        return self.predicted[category] / max(self.measured[category], 1) - 1.0

    def failures(self) -> list[str]:
        """The categories outside TOLERANCES, each with its error."""
        return [
            f"{self.name}: {cat} off by {self.error(cat):+.1%} (allowed {tol:.0%})"
            for cat, tol in TOLERANCES.items()
            if abs(self.error(cat)) > tol
        ]

    def rows(self, date: str | None = None, origin: str | None = None) -> list[CalibrationRow]:
        """The comparison as calibration rows, one per category measured (dated today by
        default)."""
        date = date or datetime.date.today().isoformat()
        origin = origin or (
            f"OMP_NUM_THREADS=1 python bench/planner_accuracy.py --only {shlex.quote(self.name)}"
        )
        return [
            CalibrationRow(
                source=SOURCE,
                quantity=QUANTITY[cat],
                measured=self.measured[cat],
                predicted=self.predicted[cat],
                model=model_name(self.overrides),
                hardware=HARDWARE,
                layout=self.name,
                overrides=self.overrides,
                planner_layout=self.label,
                precision=self.precision,
                seq_len=self.seq_len,
                global_batch_size=self.global_batch_size,
                origin=origin,
                date=date,
            )
            for cat in CATEGORIES
            if self.measured[cat] > 0  # a run that recorded no peak RSS has no process row
        ]


def comparisons(rows: Iterable[CalibrationRow]) -> list[Comparison]:
    """The measured-cpu memory rows grouped back into one Comparison per layout (in the rows'
    order); a layout that lacks a category, or has a row without a prediction, is left out."""
    category = {q: c for c, q in QUANTITY.items()}
    by_layout: dict[str, list[CalibrationRow]] = {}
    for r in rows:
        if r.source == SOURCE and r.quantity in category and r.predicted is not None:
            by_layout.setdefault(r.layout, []).append(r)
    out = []
    for name, group in by_layout.items():
        got = {category[r.quantity]: r for r in group}
        if set(got) != set(CATEGORIES):
            continue
        first = group[0]
        out.append(
            Comparison(
                name,
                first.planner_layout,
                {c: got[c].predicted for c in CATEGORIES},
                {c: got[c].measured for c in CATEGORIES},
                first.overrides,
                first.precision,
                first.seq_len,
                first.global_batch_size,
            )
        )
    return out


def model_name(overrides: Iterable[str]) -> str:
    """The conf/model choice among `overrides` (train.yaml's default, tiny, without one)."""
    names = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "model"]
    return names[-1] if names else "tiny"


def predict(overrides: list[str]):
    """The planner's `Candidate` for the run `train.py OVERRIDES` would start."""
    from lightning.pytorch.strategies import SingleDeviceStrategy

    from lightning_dist.config import compose_config, hardware_spec, model_spec
    from lightning_dist.layout import Batch
    from lightning_dist.run.plan import build_strategy, resolve_layout
    from lightning_dist.run.preflight import estimate_run

    cfg = compose_config(list(overrides))
    spec, hardware = model_spec(cfg), hardware_spec(cfg)
    strategy = build_strategy(cfg.strategy, hardware)
    single = isinstance(strategy, SingleDeviceStrategy)
    world = 1 if single else hardware.resolved_devices() * hardware.num_nodes
    layout = resolve_layout(strategy, world)
    precision = cfg.trainer.precision or hardware.precision
    return estimate_run(Batch.of_config(cfg.data), spec, hardware, strategy, layout, precision)


def predicted_bytes(candidate) -> dict[str, float]:
    """The planner's side of each category (see CATEGORIES) for `candidate`."""
    mem = candidate.memory
    return {
        "model states": mem.params + mem.grads + mem.optimizer,
        "activations": mem.activations,
        "total": mem.tensors,
        "process": mem.total,
    }


def repredict(rows: Iterable[CalibrationRow]) -> list[CalibrationRow]:
    """The measured-cpu memory rows with the planner's prediction (and layout label) asked
    again for their stored overrides; the measured values are kept. Other rows are returned
    as they are. Planner-only: nothing runs train.py."""
    category = {q: c for c, q in QUANTITY.items()}
    cache: dict[tuple[str, ...], object] = {}
    out = []
    for r in rows:
        if r.source != SOURCE or r.quantity not in category:
            out.append(r)
            continue
        if r.overrides not in cache:
            cache[r.overrides] = predict(list(r.overrides))
        candidate = cache[r.overrides]
        out.append(
            replace(
                r,
                predicted=predicted_bytes(candidate)[category[r.quantity]],
                planner_layout=candidate.describe(),
            )
        )
    return out


def measure(overrides: list[str], run_dir: str | Path, train=None) -> dict[str, float]:
    """Run train.py (or `train(overrides, run_dir)`, which returns the run's summary); the
    largest over ranks of model states, activations, the step's peak of tensors (total) and the
    process's peak resident memory (process, for the reserve: only a fresh process, as train.py
    starts, measures it; ranks that trained before keep their high-water mark)."""
    from lightning_dist.run.parity_runs import run_train

    summary = (train or run_train)(list(overrides), run_dir)
    ranks = [r for r in summary.get("memory_by_category") or [] if r]
    if not ranks:
        raise RuntimeError(f"train.py {' '.join(overrides)} measured no memory by category")
    return {
        "model states": max(r["params"] + r["grads"] + r["optimizer"] for r in ranks),
        "activations": max(r["activations"] for r in ranks),
        "total": max(r["total"] for r in ranks),
        "process": max(summary.get("peak_memory_bytes") or [0]),
    }


def compare(name: str, extra: tuple[str, ...] = (), workdir: str | Path | None = None, train=None):
    """Predict and measure layout `name` of LAYOUTS (with `extra` overrides appended); `train`
    as in `measure`."""
    overrides = [*COMMON, *LAYOUTS[name], *extra]
    candidate = predict(overrides)
    with tempfile.TemporaryDirectory(prefix="calibrate-", dir=workdir) as tmp:
        measured = measure(overrides, Path(tmp) / "run", train)
    st = candidate.settings
    return Comparison(
        name,
        candidate.describe(),
        predicted_bytes(candidate),
        measured,
        tuple(overrides),
        st.precision,
        st.seq_len,
        st.global_batch_size,
    )
