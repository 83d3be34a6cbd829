"""Option classes for ranks of unequal speed and slow links between them (docs/SLOW_LINKS.md):
speed-weighted data-parallel shares, gradient compression, the DiLoCo outer loop, and the test
tool that simulates slow devices and links. Plain Python like `knobs.py`, whose `knob()`
declares each field once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lightning_dist.options.knobs import knob

GRAD_COMPRESSIONS = ("none", "bf16", "fp16", "powersgd")


def _whole(value: Any, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"strategy.{name}={value!r} must be a whole number of at least {minimum}")


def _number(value: Any, name: str, low: float, *, above: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not ok or (value <= low if above else value < low):
        bound = f"above {low:g}" if above else f"at least {low:g}"
        raise ValueError(f"strategy.{name}={value!r} must be a number {bound}")
    return float(value)


@dataclass(frozen=True, kw_only=True)
class DataShareOptions:
    """How the global batch is split between data-parallel ranks of unequal speed (DDP)."""

    dp_shares: list[int] | None = knob(
        None,
        "Relative share of the global batch of each data-parallel rank, in rank order "
        "(strategy=ddp), e.g. [2, 1]: rank 0 runs twice as many micro-batches per step as rank "
        "1 (uneven gradient accumulation, the extra ones under no_sync). The global batch, the "
        "weight of every token in the loss, and so the losses stay one device's. The batch is "
        "cut into sum(dp_shares) x k micro-batches of data.per_rank_batch_size (null: k = 1). "
        "null: equal shares. FSDP strategies refuse it: a rank with more forwards would run "
        "more all-gathers than its peers.",
        planner_ignores="the planner plans equal data-parallel shares",
    )

    def __post_init__(self) -> None:
        shares = self.dp_shares
        if shares is None:
            return
        if isinstance(shares, str | dict) or not hasattr(shares, "__iter__"):
            raise ValueError(f"strategy.dp_shares={shares!r} must be a list of whole numbers")
        shares = list(shares)
        if len(shares) < 1 or any(
            isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shares
        ):
            raise ValueError(
                f"strategy.dp_shares={shares!r} must be whole numbers of at least 1, one per "
                "data-parallel rank (e.g. [2, 1])"
            )
        object.__setattr__(self, "dp_shares", shares)


@dataclass(frozen=True, kw_only=True)
class GradientSyncOptions:
    """How DDP's replicas exchange gradients over a slow link: compressed, or rarely (DiLoCo)."""

    grad_compression: str = knob(
        "none",
        "DDP's gradient all-reduce: none (fp32), bf16 or fp16 (each bucket cast, "
        "averaged, cast back: torch's compress hooks) or powersgd (low-rank matrices, with error "
        "feedback; torch's PowerSGD hook, strategy.powersgd_rank). FSDP strategies: set "
        "strategy.reduce_dtype instead.",
    )
    powersgd_rank: int = knob(
        2,
        "Rank of PowerSGD's matrix approximation (strategy.grad_compression=powersgd).",
    )
    powersgd_start_step: int = knob(
        10,
        "Optimizer steps whose gradients are all-reduced uncompressed before PowerSGD "
        "starts (torch's start_powerSGD_iter; at least 2, as its error feedback needs).",
        planner_ignores="the planner times the steady state, past the uncompressed steps",
    )
    diloco_inner_steps: int = knob(
        0,
        "DiLoCo across the data-parallel replicas (strategy=ddp): each replica takes this "
        "many optimizer steps on its own gradients (no all-reduce), then the replicas average "
        "their parameter change since the last sync (one all-reduce) and apply it with an outer "
        "SGD with Nesterov momentum. 0: off (every step all-reduces gradients).",
    )
    diloco_outer_lr: float = knob(
        0.7,
        "Learning rate of DiLoCo's outer step; the default is the paper's, tuned for H of "
        "hundreds of steps. 1.0 with momentum 0 is plain parameter averaging (LocalSGD), which "
        "at H = 8 kept the loss within 3% of DDP's where the default lost 14% "
        "(docs/SLOW_LINKS.md).",
        planner_ignores="an optimisation setting, no time or memory",
    )
    diloco_outer_momentum: float = knob(
        0.9,
        "Nesterov momentum of DiLoCo's outer step (0: none, and no momentum buffer).",
    )

    def __post_init__(self) -> None:
        if self.grad_compression not in GRAD_COMPRESSIONS:
            raise ValueError(
                f"strategy.grad_compression={self.grad_compression!r} is not one of "
                f"{', '.join(GRAD_COMPRESSIONS)}"
            )
        _whole(self.powersgd_rank, "powersgd_rank", 1)
        _whole(self.powersgd_start_step, "powersgd_start_step", 2)
        _whole(self.diloco_inner_steps, "diloco_inner_steps", 0)
        object.__setattr__(
            self, "diloco_outer_lr", _number(self.diloco_outer_lr, "diloco_outer_lr", 0, above=True)
        )
        momentum = _number(self.diloco_outer_momentum, "diloco_outer_momentum", 0)
        if momentum >= 1:
            raise ValueError(f"strategy.diloco_outer_momentum={momentum!r} must be below 1")
        object.__setattr__(self, "diloco_outer_momentum", momentum)
        if self.diloco_inner_steps and self.grad_compression != "none":
            raise ValueError(
                f"strategy.diloco_inner_steps={self.diloco_inner_steps} all-reduces no gradients "
                f"to compress; set strategy.grad_compression=none (not "
                f"{self.grad_compression!r}) or strategy.diloco_inner_steps=0"
            )


@dataclass(frozen=True, kw_only=True)
class SimulationOptions:
    """A test and benchmark tool, never for real training: ranks made slower than they are,
    and a delay on each gradient all-reduce (`cluster/simulate.py`; CPUs only)."""

    simulate_slowdown: Any = knob(
        None,
        "TEST TOOL. Simulated speed per rank: a list by global rank ([1, 3]: rank 1 three "
        "times slower) or {rank: factor} (unlisted ranks 1). Each block and each linear layer "
        "outside the blocks (the output projection) then takes factor x 2 x parameters x tokens "
        "/ strategy.simulate_flops seconds forward and twice that backward: a hook sleeps until "
        "then (real compute counts towards it). null: off. CPUs only.",
        planner_ignores="a test tool",
        hydra_type=Any,
    )
    simulate_flops: float = knob(
        1e9,
        "TEST TOOL. FLOP/s of a simulated rank of slowdown 1 (strategy.simulate_slowdown); "
        "keep it below the machine's real speed so the simulated time, not noisy real "
        "compute, sets the pace.",
        planner_ignores="a test tool",
    )
    simulate_delay_ms: float = knob(
        0.0,
        "TEST TOOL. Milliseconds each gradient all-reduce across the data-parallel "
        "replicas waits before it starts (strategy=ddp: every DDP bucket, and DiLoCo's outer "
        "all-reduce); the step's loss all-reduce is not delayed. 0: off. CPUs only.",
        planner_ignores="a test tool",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "simulate_slowdown", parse_slowdown(self.simulate_slowdown))
        object.__setattr__(
            self, "simulate_flops", _number(self.simulate_flops, "simulate_flops", 0, above=True)
        )
        object.__setattr__(
            self, "simulate_delay_ms", _number(self.simulate_delay_ms, "simulate_delay_ms", 0)
        )

    @property
    def enabled(self) -> bool:
        """Whether anything is simulated."""
        return self.simulate_slowdown is not None or self.simulate_delay_ms > 0

    def factor(self, rank: int) -> float | None:
        """The slowdown of global rank `rank`; None when slowdown is not simulated."""
        if self.simulate_slowdown is None:
            return None
        return self.simulate_slowdown.get(rank, 1.0)


def parse_slowdown(value: Any) -> dict[int, float] | None:
    """`strategy.simulate_slowdown` as {global rank: factor}; ValueError naming the bad value."""
    if value is None:
        return None
    pairs = (
        value.items()
        if hasattr(value, "items")
        else enumerate(value)
        if (hasattr(value, "__iter__") and not isinstance(value, str))
        else None
    )
    if pairs is None:
        raise ValueError(
            f"strategy.simulate_slowdown={value!r} must be a list of factors by rank or a "
            "{rank: factor} mapping"
        )
    out: dict[int, float] = {}
    for rank, factor in pairs:
        ok_rank = not isinstance(rank, bool) and isinstance(rank, int) and rank >= 0
        ok = not isinstance(factor, bool) and isinstance(factor, int | float) and factor > 0
        if not (ok_rank and ok):
            raise ValueError(
                f"strategy.simulate_slowdown={value!r}: rank {rank!r} has factor {factor!r}; "
                "ranks are whole numbers and factors positive numbers (1: the simulated speed, 3: "
                "three times slower)"
            )
        out[rank] = float(factor)
    return out
