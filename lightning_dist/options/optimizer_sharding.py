"""The ZeRO-1 knob (`strategy.shard_optimizer`): the optimizer states sharded over the
data-parallel replicas (lightning_dist/parallel/sharded_optimizer.py). Plain Python, like the
other option classes."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_dist.options.knobs import knob


@dataclass(frozen=True, kw_only=True)
class OptimizerShardingOptions:
    """ZeRO-1 under `strategy=ddp` and the mesh strategies' `dp_replicate`."""

    shard_optimizer: bool = knob(
        False,
        "ZeRO-1: each data-parallel replica keeps 1/dp of the optimizer states, beside 1/dp of "
        "the parameters it steps (parameters and gradients stay whole); the gradients are "
        "reduce-scattered into each replica's slice instead of all-reduced, and the step "
        "all-gathers the updated parameters. Needs dp_replicate > 1 and dp_shard x cp = 1 "
        "(FSDP shards the states already).",
    )

    def __post_init__(self) -> None:
        if not isinstance(self.shard_optimizer, bool):
            raise ValueError(
                f"strategy.shard_optimizer={self.shard_optimizer!r} must be true or false"
            )


def shard_optimizer_problem(layout, options) -> str | None:
    """Why `options` (a `StrategyOptions`) cannot shard the optimizer states over `layout`'s
    replicas (a resolved `Layout`), or None: nothing to shard over (dp_replicate = 1), FSDP
    sharding them already (dp_shard x cp > 1), gradient compression (a DDP hook, where ZeRO-1
    reduce-scatters), or DiLoCo (each replica steps on its own gradients, which the shards
    would mix)."""
    if not options.optimizer_sharding.shard_optimizer:
        return None
    name = "strategy.shard_optimizer=true"
    if layout.shard_size > 1:
        return (
            f"{name} with dp_shard x cp = {layout.shard_size}: FSDP shards the optimizer states "
            f"already; set strategy.shard_optimizer=false, or strategy.dp_shard=1 and "
            f"strategy.dp_replicate={layout.dp} (ZeRO-1 shards over the replicas)"
        )
    if layout.dp_replicate == 1:
        return (
            f"{name} shards the optimizer states over the data-parallel replicas, and "
            f"dp_replicate=1 has none to shard over; use 2 or more, or set "
            "strategy.shard_optimizer=false"
        )
    if options.simulate.simulate_delay_ms > 0:
        return (
            f"{name} with strategy.simulate_delay_ms={options.simulate.simulate_delay_ms:g} is "
            "not supported: the delay rides DDP's gradient all-reduce, which ZeRO-1 replaces; "
            "set strategy.simulate_delay_ms=0, or strategy.shard_optimizer=false"
        )
    compression = options.grad_sync.grad_compression
    if compression != "none":
        return (
            f"{name} with strategy.grad_compression={compression} is not supported: ZeRO-1 "
            "reduce-scatters the gradients itself, uncompressed; set "
            "strategy.grad_compression=none, or strategy.shard_optimizer=false"
        )
    inner = options.grad_sync.diloco_inner_steps
    if inner:
        return (
            f"{name} with strategy.diloco_inner_steps={inner} is not supported: DiLoCo's "
            "replicas step on their own gradients, which ZeRO-1's shards would mix; unset one"
        )
    return None


def check_shard_optimizer_precision(options, precision: str) -> None:
    """Raise ValueError when ZeRO-1 (in `options`) cannot run at `precision`: fp16 mixed
    precision's loss scaler skips a step on each rank's own gradients, which ZeRO-1 leaves
    unreduced, so the ranks would disagree (one skips the reduce-scatter the others wait in)."""
    if options.optimizer_sharding.shard_optimizer and str(precision).startswith("16-mixed"):
        raise ValueError(
            f"strategy.shard_optimizer=true with trainer.precision={precision} is not "
            "supported: the loss scaler skips a step on each rank's own gradients, which ZeRO-1 "
            "leaves unreduced, so the ranks would disagree; use bf16-mixed or 32-true"
        )
