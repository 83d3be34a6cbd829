"""RunContext: what telemetry needs to know about a run beyond the Trainer itself; StepClock:
the one clock that times optimizer steps for every telemetry callback; StepFlags: the one
all-reduce per step in which the callbacks' flags are agreed over the ranks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

import torch
import torch.distributed as dist

from lightning_dist.hardware import HardwareSpec
from lightning_dist.layout import Layout


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """Set by `train()` on every callback that has a `bind(context)` method."""

    hardware: HardwareSpec
    layout: Layout
    precision: str
    seq_len: int
    global_batch_size: int
    flops_per_token: float
    """Training FLOPs per token of the model (6N plus attention; recompute not counted)."""

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    def mfu(self, tokens_per_sec: float | None, world_size: int) -> float | None:
        """Model FLOPs utilisation against the hardware's dense peak; None if unknown."""
        peak = self.hardware.peak_flops(self.precision)
        if not peak or not tokens_per_sec:
            return None
        return self.flops_per_token * tokens_per_sec / (peak * world_size)


class StepClock:
    """The end time of every optimizer step of one fit: the one clock of all telemetry.

    Each callback that needs step times takes its trainer's clock with `step_clock(trainer)`,
    calls `start(trainer)` in `on_train_start` and `tick(trainer, batch_idx)` in
    `on_train_batch_end`. Whichever callback runs first after an optimizer step records the time
    and the others find it recorded, so the clock ticks exactly once per step whatever the
    callback order, and never between the micro-batches of gradient accumulation (the global
    step does not move there). This needs no `train()`: plain Lightning code gets it too.
    """

    def __init__(self) -> None:
        self.start_time = 0.0
        """`time.perf_counter()` when training started."""
        self.end_times: list[float] = []
        """`time.perf_counter()` at the end of each optimizer step."""
        self._step: int | None = None  # trainer.global_step at the start or at the last tick
        self._batch: tuple[int, int] | None = None  # (epoch, batch_idx) that made the last tick

    def start(self, trainer: Any) -> None:
        """Start timing a fit; callbacks after the first find the clock running already."""
        if self._step == trainer.global_step and not self.end_times:
            return
        self.start_time = time.perf_counter()
        self.end_times = []
        self._step = trainer.global_step
        self._batch = None

    def tick(self, trainer: Any, batch_idx: int) -> bool:
        """Record the end of the optimizer step that just finished, once; return whether this
        batch ended an optimizer step (False for micro-batches that only accumulate)."""
        if self._step is None:  # no callback started it: time from here on
            self.start(trainer)
        batch = (trainer.current_epoch, batch_idx)
        if trainer.global_step != self._step:
            device = trainer.strategy.root_device
            if device.type == "cuda":  # time the step's kernels, not their launch
                torch.cuda.synchronize(device)
            self.end_times.append(time.perf_counter())
            self._step, self._batch = trainer.global_step, batch
        return self._batch == batch

    def step_seconds(self) -> list[float]:
        """Wall time of each optimizer step; the first includes warm-up."""
        ends = [self.start_time, *self.end_times]
        return [b - a for a, b in zip(ends, ends[1:], strict=False)]

    def steady_step_seconds(self, last: int | None = None) -> float | None:
        """THE step-time statistic of telemetry: the median wall time of the optimizer steps
        after the first (which pays for warm-up), or of the `last` of them; None before the
        second step. The median keeps the profiled, validation and checkpoint steps out."""
        steady = self.step_seconds()[1:]
        if last is not None:
            steady = steady[-last:]
        return statistics.median(steady) if steady else None


_CLOCKS: WeakKeyDictionary[Any, StepClock] = WeakKeyDictionary()


def _one_per_trainer(made: WeakKeyDictionary, trainer: Any, make: Callable[[], Any]) -> Any:
    """`made[trainer]`, made by `make()` on first use (it lives as long as the trainer)."""
    found = made.get(trainer)
    if found is None:
        found = made[trainer] = make()
    return found


def step_clock(trainer: Any) -> StepClock:
    """The one step clock of `trainer`, made on first use and shared by every callback."""
    return _one_per_trainer(_CLOCKS, trainer, StepClock)


def any_rank(flags: list[bool], device: torch.device) -> list[bool]:
    """Each flag OR-ed over every rank (one all-reduce)."""
    values = torch.tensor([float(f) for f in flags], device=device)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return [bool(v) for v in values.tolist()]


class StepFlags:
    """Flags the ranks OR together once per optimizer step, in one all-reduce for all the
    callbacks that need one, instead of one each (every collective waits for the slowest rank).

    The NaN guard agrees on its flags before each optimizer step (`agree`); a callback that only
    needs its flag after the step (Preemption) registers it (`add`), and it is agreed along
    with them; `agreed` reads it back, or runs an all-reduce of its own for a step in which no
    agreement ran (no NaN guard in the trainer). Every rank runs the same hooks, so every rank
    takes the same path."""

    def __init__(self) -> None:
        self._flags: dict[str, Callable[[], bool]] = {}
        self._agreed: tuple[int, dict[str, bool]] | None = None
        """(optimizer step, each added flag OR-ed over the ranks) of the last agreement."""

    def add(self, name: str, flag: Callable[[], bool]) -> None:
        """Read `flag()` at every agreement from now on (a name added again is replaced)."""
        self._flags[name] = flag

    def remove(self, name: str) -> None:
        """Stop reading flag `name` (if it was added)."""
        self._flags.pop(name, None)

    def agree(self, trainer: Any, flags: list[bool]) -> list[bool]:
        """Before optimizer step N: `flags` and every added flag OR-ed over the ranks in one
        all-reduce; returns `flags`' and keeps the added ones' for step N."""
        names = list(self._flags)
        values = any_rank(
            [*flags, *(self._flags[n]() for n in names)], trainer.strategy.root_device
        )
        self._agreed = (
            trainer.global_step + 1,
            dict(zip(names, values[len(flags) :], strict=True)),
        )
        return values[: len(flags)]

    def agreed(self, trainer: Any, name: str) -> bool:
        """After optimizer step N: added flag `name` OR-ed over the ranks, as agreed before
        step N, or by an all-reduce of its own where no agreement ran for step N."""
        if self._agreed is not None and self._agreed[0] == trainer.global_step:
            return self._agreed[1][name]
        return any_rank([self._flags[name]()], trainer.strategy.root_device)[0]


_FLAGS: WeakKeyDictionary[Any, StepFlags] = WeakKeyDictionary()


def step_flags(trainer: Any) -> StepFlags:
    """The one `StepFlags` of `trainer`, made on first use and shared by every callback."""
    return _one_per_trainer(_FLAGS, trainer, StepFlags)
