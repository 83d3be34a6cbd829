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
from lightning_dist.layout import Batch, Layout


def estimate_run(
    batch: Batch, spec: Any, hardware: HardwareSpec, strategy: Any, layout: Layout, precision: str
):
    """The planner's prediction for exactly this run (one layout, its sharding and batch)."""
    from lightning_dist.planner import estimate

    return estimate(
        spec,
        hardware,
        layout,
        global_batch_size=batch.global_batch_size,
        seq_len=batch.seq_len,
        precision=precision,
        micro_batch_size=batch.micro_batch_size,
        options=contract_of(strategy).options,
    )


def best_layout_hint(
    batch: Batch, strategy_cfg: Any, spec: Any, hardware: HardwareSpec, precision: str
) -> str:
    """One line: the planner's best layout for this model and hardware and the train.py
    command that runs it, or why none fits."""
    from lightning_dist.planner import plan_layouts
    from lightning_dist.run.plan_table import compile_settings, hydra_task_overrides, train_command

    result = plan_layouts(
        spec,
        hardware,
        global_batch_size=batch.global_batch_size,
        seq_len=batch.seq_len,
        precision=precision,
        **compile_settings(strategy_cfg),
    )
    if result.chosen is None:
        return result.message
    best = result.candidates[result.chosen]
    command = train_command(hydra_task_overrides(), best)
    return f"the planner suggests: {best.describe()}; run it: {command}"


def check_fits(plan: Any) -> None:
    """Raise ValueError with the numbers if the planner predicts the planned run (a
    `run.plan.RunPlan`) does not fit; warn in one line when its data loaders would not keep
    up with the predicted tokens/s (`run/data_rate.py`)."""
    from lightning_dist.runtime.console import warn_once

    if plan.hardware.memory_gib is None:
        return  # CPU ranks share host memory: nothing to check against
    args = plan.batch, plan.model, plan.hardware
    candidate = estimate_run(*args, plan.strategy, plan.layout, plan.precision)
    if not candidate.fits:
        hint = best_layout_hint(plan.batch, plan.spec.strategy, *args[1:], plan.precision)
        raise ValueError(f"{candidate.reason}; {hint} (run anyway with plan.check=false)")
    warning = loader_warning(plan, candidate.as_dict().get("tokens_per_sec"))
    if warning:
        warn_once(warning)


def loader_warning(plan: Any, tokens_per_sec: float | None) -> str | None:
    """`data_rate.keep_up_warning` for the planned run's data config and layout."""
    from omegaconf import OmegaConf

    from lightning_dist.run.data_rate import keep_up_warning

    data = OmegaConf.to_container(plan.spec.data, resolve=False)
    assert isinstance(data, dict)
    return keep_up_warning({str(k): v for k, v in data.items()}, tokens_per_sec, plan.layout.dp)


def print_prediction(plan: Any) -> bool:
    """Print the prediction for the planned run (a `run.plan.RunPlan`) and the planner's best;
    return whether it fits."""
    from lightning_dist.planner.labels import batch_line, format_seconds
    from lightning_dist.run.plan_table import (
        assumptions,
        config_choice,
        hydra_task_overrides,
        plan_notes,
    )

    batch, spec, hardware, precision = plan.batch, plan.model, plan.hardware, plan.precision
    strategy_cfg = plan.spec.strategy
    candidate = estimate_run(batch, spec, hardware, plan.strategy, plan.layout, precision)
    memory = candidate.as_dict()
    gib = {k: v / 1024**3 for k, v in memory["memory_bytes"].items()}
    overrides = hydra_task_overrides()
    model_name = config_choice(overrides, "model")
    for line in assumptions(
        batch, plan.spec.trainer.precision, strategy_cfg, spec, hardware, model_name
    ):
        print(line)
    for note in plan_notes(batch, spec, hardware, overrides):
        print(note)
    print(
        f"plan for strategy={plan.spec.strategy_name} on {hardware.name} "
        f"({hardware.num_nodes} node(s) x {hardware.resolved_devices()} devices):"
    )
    print(f"  layout: {candidate.describe(plan.spec.strategy_name)}")
    print(f"  {batch_line(candidate)}")
    print("  memory per device (GiB): " + ", ".join(f"{k} {v:.2f}" for k, v in gib.items()))
    step = memory.get("step_seconds")
    if step:
        mfu = memory.get("mfu")
        print(
            f"  step {format_seconds(step)}, {memory['tokens_per_sec']:,.0f} tokens/s, "
            f"MFU {'n/a' if mfu is None else f'{mfu:.1%}'}, "
            f"comm/compute {memory['comm_compute_ratio']:.2f}"
        )
    print(f"  fits: {'yes' if candidate.fits else 'no: ' + str(candidate.reason)}")
    loader = loader_warning(plan, memory.get("tokens_per_sec"))
    if loader:  # silent when the loaders keep up (the README shows this output as it is)
        print(f"  warning: {loader}")
    print(f"  {best_layout_hint(batch, strategy_cfg, spec, hardware, precision)}")
    return candidate.fits


def planned_strategy(
    batch: Batch, spec: Any, hardware: HardwareSpec, precision: str | None
) -> tuple[dict, int | None, str]:
    """`strategy=auto`: the planner's fastest layout that fits, as Parallel3DStrategy keyword
    arguments, the per-rank micro-batch size to use (None under PP, where the strategy cuts a
    rank's batch into the pipeline microbatches), and a one-line description. `precision`
    null takes the hardware's.

    Raises ValueError (the planner's NoLayoutFitsError) when nothing fits.
    """
    from lightning_dist.planner import plan_layouts

    micro = batch.micro_batch_size
    result = plan_layouts(
        spec,
        hardware,
        global_batch_size=batch.global_batch_size,
        seq_len=batch.seq_len,
        precision=precision or hardware.precision,
        micro_batch_sizes=(micro,) if micro else None,
        allow_offload=False,  # strategy=auto runs without CPU offload (its kwargs below)
    )
    best = result.best()
    layout, settings = best.layout, best.settings
    kwargs = {
        "pp": layout.pp,
        "dp_replicate": layout.dp_replicate,
        "dp_shard": layout.dp_shard,
        "tp": layout.tp,
        "ep": layout.ep,
        "schedule": layout.schedule,
        "microbatches": best.grad_accumulation if layout.pp > 1 else None,
        "virtual_stages": layout.virtual_stages,
        # auto stays auto: the strategy turns it on where the model's TP plan allows.
        "sequence_parallel": settings.options.tp.sequence_parallel if layout.tp > 1 else False,
        "activation_checkpointing": settings.activation_checkpointing.setting,
        "reshard_after_forward": settings.sharding != "SHARD_GRAD_OP",
        "shard_optimizer": settings.sharding == "SHARD_OPTIMIZER",
    }
    if layout.cp > 1:
        kwargs |= {"cp": layout.cp, "cp_mode": settings.cp_mode}
    if settings.options.pipeline.split_points:  # mixed hardware: the blocks by speed
        kwargs["split_points"] = list(settings.options.pipeline.split_points)
    # Named as what runs it: the 3d strategy, whatever strategy the same layout would take alone.
    return kwargs, (None if layout.pp > 1 else settings.micro_batch_size), best.describe("3d")
