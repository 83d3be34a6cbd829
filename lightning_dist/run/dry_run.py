"""`plan.dry_run=true` / `python -m lightning_dist.plan ... --dry-run`: the planned run, built
by the real strategy code at its full world size in this one CPU process, next to the planner.

For each rank it dry-runs (`measure/fake_rank.py`: torch's fake process group, fake tensors, one
optimizer step) it prints the parameter, gradient and optimizer bytes the rank holds and the
ring bytes it moves over each mesh dimension in one step, beside what the planner predicts for
that rank (`planner.memory.model_state_bytes`, `planner.traffic.traffic_by_dim`). Without
pipeline parallelism every rank holds and sends alike, so rank 0 stands for all; with it, the
first, second and last pipeline ranks (the first and last stages hold the embedding and the
output, the second a full run of blocks).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from lightning_dist.layout import Layout
from lightning_dist.planner.memory import model_state_bytes
from lightning_dist.planner.stage_shapes import stage_shapes
from lightning_dist.planner.traffic import ring_volume, traffic_by_dim

GiB = 1024**3
NEGLIGIBLE_BYTES = 2**20
"""Traffic the planner leaves out when it is this small (the clipping norm's all-reduce)."""
MESH_STRATEGIES = ("3d", "fsdp2", "tp", "pp", "auto")
"""The strategies whose model `parallel.parallelize` builds, which the dry run can build."""


@dataclass(frozen=True)
class RankComparison:
    """One dry-run rank beside the planner's prediction for its stage."""

    measured: Any
    """`measure.fake_rank.RankDryRun`."""
    predicted_states: dict[str, float]
    """params, grads, optimizer: bytes."""
    predicted_traffic: dict[str, float]
    """Ring bytes per step by mesh dimension."""

    def state_error(self) -> float:
        predicted = sum(self.predicted_states.values())
        return self.measured.model_state_bytes / predicted - 1

    def traffic_errors(self) -> dict[str, float]:
        """measured / predicted - 1 for each dimension either side has (inf: unpredicted)."""
        measured = self.measured.traffic.volume
        out = {}
        for dim in sorted(set(measured) | set(self.predicted_traffic)):
            got, want = measured.get(dim, 0.0), self.predicted_traffic.get(dim, 0.0)
            out[dim] = got / want - 1 if want else (0.0 if got < NEGLIGIBLE_BYTES else float("inf"))
        return out


def dry_run_ranks(layout: Layout) -> list[int]:
    """The global ranks the dry run builds: rank 0, or the first, second and last pipeline
    ranks (each at data- and tensor-parallel coordinate 0)."""
    if layout.pp == 1:
        return [0]
    stride = layout.world_size // layout.pp
    return [r * stride for r in sorted({0, min(1, layout.pp - 1), layout.pp - 1})]


def options_on_device(options, precision: str, accelerator: str):
    """`options` with FSDP's dtypes resolved as the target device resolves them (null
    param_dtype follows a mixed precision on GPUs), so a CPU process builds the GPU's policy."""
    from lightning_dist.parallel.precision import mixed_dtypes

    dtypes = mixed_dtypes(
        param_dtype=options.precision.param_dtype,
        reduce_dtype=options.precision.reduce_dtype,
        precision=precision,
        device_type="cuda" if accelerator == "gpu" else "cpu",
    )
    if dtypes is None:
        return options
    name = str(dtypes.compute).removeprefix("torch.")
    return replace(options, precision=replace(options.precision, param_dtype=name))


def check_dry_run(plan: Any) -> None:
    """Raise ValueError naming what the dry run cannot build."""
    name = plan.spec.strategy_name
    if name not in MESH_STRATEGIES:
        raise ValueError(
            f"plan.dry_run builds the mesh strategies ({', '.join(MESH_STRATEGIES)}), not "
            f"strategy={name}; its layouts run as strategy=3d with the same degrees"
        )
    if not hasattr(plan.model, "build") or not hasattr(plan.model, "dim"):
        raise ValueError(
            f"plan.dry_run builds the Llama-style models of conf/model (ModelArgs), not "
            f"{type(plan.model).__name__}"
        )
    experts = getattr(plan.model, "num_experts", 0)
    if experts and plan.precision != "bf16-mixed":
        raise ValueError(
            f"plan.dry_run of a mixture of experts (model.num_experts={experts}) runs under "
            f"trainer.precision=bf16-mixed only, not {plan.precision}: torch's fake grouped "
            "matmul takes bf16 operands only; set trainer.precision=bf16-mixed for the dry run"
        )
    options = plan.strategy.options
    if options.compile.backend is not None or options.sharding.cpu_offload:
        raise ValueError(
            "plan.dry_run runs without strategy.compile and strategy.cpu_offload (fake tensors "
            "cannot be compiled or offloaded); set them to false for the dry run"
        )


def dry_run(plan: Any, *, progress=print) -> list[RankComparison]:
    """Dry-run the planned run (a `run.plan.RunPlan`) rank by rank; see the module doc."""
    from lightning_dist.measure.fake_rank import dry_run_rank, each_in_a_fresh_process
    from lightning_dist.run.preflight import estimate_run

    check_dry_run(plan)
    candidate = estimate_run(
        plan.batch, plan.model, plan.hardware, plan.strategy, plan.layout, plan.precision
    )
    layout, settings = candidate.layout, candidate.settings
    options = options_on_device(plan.strategy.options, plan.precision, plan.hardware.accelerator)
    shapes = [s for _, s in stage_shapes(plan.model, layout, options.pipeline.split_points)]
    # Micro-steps per optimizer step: Lightning's accumulation (each one a whole schedule
    # under PP, whose microbatches the schedule runs itself).
    accumulate = candidate.grad_accumulation // (layout.num_microbatches if layout.pp > 1 else 1)
    ranks = dry_run_ranks(layout)
    progress(
        f"dry run: rank(s) {', '.join(map(str, ranks))} of {layout.world_size}, each in a "
        "process of its own ..."
    )
    build = partial(
        dry_run_rank,
        plan.model.build,
        layout,
        options=options,
        precision=plan.precision,
        micro_batch_size=settings.micro_batch_size,
        seq_len=settings.seq_len,
        accumulate=accumulate,
        ring_volume=ring_volume,
        grad_clip=plan.spec.trainer.gradient_clip_val,
    )
    measured = each_in_a_fresh_process(build, ranks)
    out = []
    for rank in measured:
        shape = shapes[rank.coordinate["pp"]]
        params, grads, optimizer, _ = model_state_bytes(layout, settings, shape)
        predicted = {"params": params, "grads": grads, "optimizer": optimizer}
        out.append(
            RankComparison(rank, predicted, traffic_by_dim(plan.model, layout, settings, shape))
        )
    return out


def print_dry_run(comparisons: list[RankComparison], layout_text: str) -> None:
    """The table: each rank's bytes measured and predicted, and the error."""
    print(f"dry run of {layout_text} (fake process group, fake tensors, one optimizer step):")
    print(f"{'rank':>6} {'what':<34} {'measured':>12} {'planner':>12} {'error':>8}")
    for c in comparisons:
        m = c.measured
        rows = [
            ("params GiB", m.param_bytes, c.predicted_states["params"]),
            ("grads GiB", m.grad_bytes, c.predicted_states["grads"]),
            ("optimizer GiB", m.optimizer_bytes, c.predicted_states["optimizer"]),
            ("model states GiB", m.model_state_bytes, sum(c.predicted_states.values())),
        ]
        for dim in sorted(set(m.traffic.volume) | set(c.predicted_traffic)):
            calls = m.traffic.calls.get(dim, 0)
            rows.append(
                (
                    f"{dim} GiB/step ({calls} calls)",
                    m.traffic.volume.get(dim, 0.0),
                    c.predicted_traffic.get(dim, 0.0),
                )
            )
        for what, got, want in rows:
            error = (
                f"{got / want - 1:+.1%}"
                if want
                else "-"
                if got < NEGLIGIBLE_BYTES
                else "unpredicted"
            )
            print(f"{m.rank:>6} {what:<34} {got / GiB:>12.3f} {want / GiB:>12.3f} {error:>8}")
        print(f"{m.rank:>6} {'seconds here':<34} {m.seconds:>12.1f}")
