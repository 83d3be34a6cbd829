"""Pre-flight: check a configured run against the planner before any process starts.

`train.py plan.only=true` prints the prediction for the configured strategy and layout (and
the planner's best layout) and exits, so it works on a laptop for any hardware spec. With
`plan.check=true` (the default) a layout predicted not to fit stops the run with the numbers
and the planner's suggestion, before anything is allocated.
"""

from __future__ import annotations

from typing import Any

from lightning_dist.contract import contract_of
from lightning_dist.hardware import HardwareSpec
from lightning_dist.layout import Layout


def estimate_run(cfg: Any, spec: Any, hardware: HardwareSpec, strategy: Any, layout: Layout,
                 precision: str):  # fmt: skip
    """The planner's prediction for exactly this run (one layout, its sharding and batch)."""
    from lightning_dist.planner import estimate

    return estimate(
        spec,
        hardware,
        layout,
        global_batch_size=int(cfg.data.global_batch_size),
        seq_len=int(cfg.data.seq_len),
        precision=precision,
        micro_batch_size=cfg.data.micro_batch_size,
        options=contract_of(strategy).options,
    )


def best_layout_hint(cfg: Any, spec: Any, hardware: HardwareSpec, precision: str) -> str:
    """One line: the planner's best layout for this model and hardware and the train.py
    command that runs it, or why none fits."""
    from lightning_dist.plan import compile_settings, hydra_task_overrides, train_command
    from lightning_dist.planner import plan_layouts

    result = plan_layouts(
        spec,
        hardware,
        global_batch_size=int(cfg.data.global_batch_size),
        seq_len=int(cfg.data.seq_len),
        precision=precision,
        **compile_settings(cfg),
    )
    if result.chosen is None:
        return result.message
    best = result.candidates[result.chosen]
    command = train_command(hydra_task_overrides(), best)
    return f"the planner suggests: {best.describe()}; run it: {command}"


def check_fits(cfg, spec, hardware, strategy, layout, precision) -> None:
    """Raise ValueError with the numbers if the planner predicts this run does not fit."""
    if hardware.memory_gib is None:
        return  # CPU ranks share host memory: nothing to check against
    candidate = estimate_run(cfg, spec, hardware, strategy, layout, precision)
    if not candidate.fits:
        raise ValueError(
            f"{candidate.reason}; {best_layout_hint(cfg, spec, hardware, precision)} "
            "(run anyway with plan.check=false)"
        )


def print_prediction(cfg, spec, hardware, strategy, layout, precision) -> bool:
    """Print the prediction for this run and the planner's best; return whether it fits."""
    from lightning_dist.plan import assumptions, batch_note, config_choice, hydra_task_overrides

    candidate = estimate_run(cfg, spec, hardware, strategy, layout, precision)
    memory = candidate.as_dict()
    gib = {k: v / 1024**3 for k, v in memory["memory_bytes"].items()}
    overrides = hydra_task_overrides()
    for line in assumptions(cfg, spec, hardware, config_choice(overrides, "model")):
        print(line)
    note = batch_note(cfg, spec, overrides)
    if note:
        print(note)
    print(f"plan for strategy={cfg.strategy.name} on {hardware.name} "
          f"({hardware.num_nodes} node(s) x {hardware.resolved_devices()} devices):")  # fmt: skip
    print(f"  layout: {candidate.describe()}")
    print("  memory per device (GiB): "
          + ", ".join(f"{k} {v:.2f}" for k, v in gib.items()))  # fmt: skip
    step = memory.get("step_seconds")
    if step:
        mfu = memory.get("mfu")
        print(f"  step {step:.3f} s, {memory['tokens_per_sec']:,.0f} tokens/s, "
              f"MFU {'n/a' if mfu is None else f'{mfu:.1%}'}, "
              f"comm/compute {memory['comm_compute_ratio']:.2f}")  # fmt: skip
    print(f"  fits: {'yes' if candidate.fits else 'no: ' + str(candidate.reason)}")
    print(f"  {best_layout_hint(cfg, spec, hardware, precision)}")
    return candidate.fits


def planned_strategy(cfg: Any, spec: Any, hardware: HardwareSpec) -> tuple[dict, int | None, str]:
    """`strategy=auto`: the planner's fastest layout that fits, as Parallel3DStrategy keyword
    arguments, the per-rank micro-batch size to use (None under PP, where the strategy cuts a
    rank's batch into the pipeline microbatches), and a one-line description.

    Raises ValueError (the planner's NoLayoutFitsError) when nothing fits.
    """
    from lightning_dist.planner import plan_layouts

    micro = cfg.data.micro_batch_size
    result = plan_layouts(
        spec,
        hardware,
        global_batch_size=int(cfg.data.global_batch_size),
        seq_len=int(cfg.data.seq_len),
        precision=cfg.trainer.precision or hardware.precision,
        micro_batch_sizes=(int(micro),) if micro else None,
        allow_offload=False,  # strategy=auto runs without CPU offload (its kwargs below)
    )
    best = result.best()
    layout, settings = best.layout, best.settings
    kwargs = {
        "pp": layout.pp,
        "dp_replicate": layout.dp_replicate,
        "dp_shard": layout.dp_shard,
        "tp": layout.tp,
        "schedule": layout.schedule,
        "microbatches": best.grad_accumulation if layout.pp > 1 else None,
        "virtual_stages": layout.virtual_stages,
        "sequence_parallel": bool(settings.sequence_parallel and layout.tp > 1),
        "activation_checkpointing": settings.activation_checkpointing.setting,
        "reshard_after_forward": settings.sharding != "SHARD_GRAD_OP",
    }
    return kwargs, (None if layout.pp > 1 else settings.micro_batch_size), best.describe()
