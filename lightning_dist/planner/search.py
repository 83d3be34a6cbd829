"""Search the layouts of a model on some hardware: what fits, what runs fastest, and why the rest
was rejected.

The layouts come from `space.py`, pruned so that 405B on 2048 nodes answers in a fraction of a
second; micro-batch sizes are the powers of two dividing the per-rank batch, and a family
stops growing them at the first that does not fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from lightning_dist.layout import Layout
from lightning_dist.planner.estimate import (
    Candidate,
    NoLayoutFitsError,
    as_model_args,
    batch_problem,
    describe,
    evaluate,
    fit_problem,
    pp_problem,
    tp_problem,
)
from lightning_dist.planner.memory import memory_per_device
from lightning_dist.planner.settings import (
    DEFAULT_DP_OVERLAP,
    DEFAULT_HEADROOM,
    GIB,
    SHARDING_MODES,
    TrainSettings,
    state_bytes,
)
from lightning_dist.planner.space import (
    dp_splits,
    layout_makers,
    powers_dividing,
    powers_of_two,
    pp_values,
)
from lightning_dist.planner.timing import step_time


@dataclass
class PlanResult:
    """Ranked candidates (fastest first), the chosen index, and the rejected families.

    When nothing fits, `chosen` is None, `candidates` holds the closest misses (fits=False,
    smallest memory first) and `message` says what would help.
    """

    candidates: list[Candidate]
    chosen: int | None
    rejected: list[dict] = field(default_factory=list)
    message: str | None = None

    def best(self) -> Candidate:
        """The chosen candidate, or raise `NoLayoutFitsError` with the explanation."""
        if self.chosen is None:
            raise NoLayoutFitsError(self.message or "no layout fits")
        return self.candidates[self.chosen]

    def as_dict(self) -> dict:
        """Exactly {"candidates": [...], "chosen": index or None, "rejected": [...]}."""
        return {
            "candidates": [c.as_dict() for c in self.candidates],
            "chosen": self.chosen,
            "rejected": self.rejected,
        }


def plan_layouts(
    model,
    hardware,
    *,
    global_batch_size: int,
    seq_len: int,
    precision: str | None = None,
    optimizer: str = "adamw",
    activation_checkpointing: bool | None = None,
    allow_offload: bool = True,
    sharding_modes: tuple[str, ...] = SHARDING_MODES,
    schedules: tuple[str, ...] = ("1F1B", "Interleaved1F1B"),
    micro_batch_sizes: tuple[int, ...] | None = None,
    sequence_parallel: bool = True,
    limit_all_gathers: bool = True,
    attention: str = "flash",
    efficiency: float | None = None,
    overlap: float = DEFAULT_DP_OVERLAP,
    headroom: float = DEFAULT_HEADROOM,
) -> PlanResult:
    """Enumerate layouts of `model` on `hardware`, keep those that fit, rank by step time.

    `activation_checkpointing=None` tries both; True/False pins it. Offload is tried for a
    sharded family only when nothing in that family fits without it. Each family (degrees plus
    FSDP mode) contributes its fastest fitting variant; ties go to the simpler layout, then the
    larger micro-batch. `rejected` lists {"family", "reason"} with the numbers. Raises
    ValueError for settings no layout could use (an unknown precision, seq_len past the model).
    """
    model = as_model_args(model)
    per_node = hardware.resolved_devices()
    world = per_node * hardware.num_nodes
    base = TrainSettings(
        global_batch_size=global_batch_size,
        seq_len=seq_len,
        precision=precision or hardware.precision,
        optimizer=optimizer,
        sequence_parallel=sequence_parallel,
        limit_all_gathers=limit_all_gathers,
        attention=attention,
    )
    if seq_len > getattr(model, "max_seq_len", seq_len):
        raise ValueError(f"seq_len={seq_len} exceeds the model's max_seq_len={model.max_seq_len}")
    ac_options = (False, True) if activation_checkpointing is None else (activation_checkpointing,)
    rejected: dict[str, str] = {}
    chosen_per_family: list[Candidate] = []
    misses: list[tuple[tuple, Layout, TrainSettings]] = []
    min_batch = math.inf  # the smallest global batch any (tp, pp) could take

    def run_family(key: str, makers, mode: str, per_rank: int) -> None:
        fitting: list[Candidate] = []
        smallest, first_problem = None, None
        offloads = (False, True) if (allow_offload and mode != "NO_SHARD") else (False,)
        for offload in offloads:
            if fitting:
                break  # offload is only worth its host traffic when nothing else fits
            for ac in ac_options:
                for make_layout in makers:
                    for mbs in micro_batch_sizes or powers_dividing(per_rank):
                        settings = replace(
                            base,
                            micro_batch_size=mbs,
                            sharding=mode,
                            activation_checkpointing=ac,
                            offload=offload,
                        )
                        try:
                            layout = make_layout(max(per_rank // mbs, 1))
                        except ValueError as err:  # e.g. 1F1B with fewer microbatches than pp
                            first_problem = first_problem or str(err)
                            continue
                        problem = batch_problem(layout, settings)
                        if problem:
                            first_problem = first_problem or problem
                            continue
                        mem = memory_per_device(
                            model, layout, settings, accelerator=hardware.accelerator
                        )
                        problem = fit_problem(mem, hardware, headroom)
                        # Report the smallest device need; a host-memory miss only if all are.
                        need = (bool(problem) and problem.startswith("offload"), mem.total)
                        if smallest is None or need < smallest[0]:
                            smallest = (need, layout, settings, problem)
                        if problem:
                            break  # larger micro-batches only need more
                        t = step_time(
                            model,
                            hardware,
                            layout,
                            settings,
                            efficiency=efficiency,
                            overlap=overlap,
                        )
                        fitting.append(Candidate(layout, settings, mem, t, True))
        if fitting:
            chosen_per_family.append(min(fitting, key=_rank))
        elif smallest is not None:
            misses.append(smallest[:3])
            rejected[key] = f"{smallest[3]}; smallest: {describe(smallest[1], smallest[2])}"
        else:
            rejected[key] = first_problem or "no micro-batch size divides the per-rank batch"

    for tp in powers_of_two(world):
        problem = tp_problem(model, per_node, tp)
        if problem:
            rejected[f"tp={tp}"] = problem
            if tp > per_node:
                break  # every larger tp crosses the node boundary too
            continue
        for pp in pp_values(world // tp, model.n_layers):
            problem = pp_problem(model, pp)
            if problem:
                rejected[f"tp={tp} pp={pp}"] = problem
                break
            dp = world // (tp * pp)
            # One sequence per data-parallel rank, and 1F1B wants pp microbatches per pipeline.
            min_batch = min(min_batch, dp * (pp if "GPipe" not in schedules else 1))
            if global_batch_size % dp:
                verb = "is smaller than" if global_batch_size < dp else "is not divisible by"
                reason = f"global_batch_size={global_batch_size} {verb} dp={dp}"
                rejected[f"tp={tp} pp={pp} dp={dp}"] = reason
                continue
            for r, s, mode in dp_splits(dp, pp, per_node // tp, sharding_modes):
                key = f"tp={tp} pp={pp} dp_replicate={r} dp_shard={s} {mode}"
                makers = layout_makers(model, pp, r, s, tp, schedules)
                run_family(key, makers, mode, global_batch_size // dp)

    rejected_list = [{"family": k, "reason": v} for k, v in rejected.items()]
    if chosen_per_family:
        return PlanResult(sorted(chosen_per_family, key=_rank), 0, rejected_list)
    if not misses:
        if global_batch_size < min_batch < math.inf:
            message = (
                f"global_batch_size={global_batch_size} is too small for {world} devices: every "
                f"layout needs at least {min_batch} sequences per step (one per data-parallel "
                f"rank, and pp microbatches per pipeline); raise it or use fewer devices"
            )
        else:
            reasons = "; ".join(list(dict.fromkeys(rejected.values()))[:4])
            message = f"no layout can exist on {world} devices: {reasons}"
        return PlanResult([], None, rejected_list, message)
    misses.sort(key=lambda miss: miss[0])
    closest = [
        evaluate(
            model, hardware, lay, st, headroom=headroom, efficiency=efficiency, overlap=overlap
        )
        for _, lay, st in misses[:5]
    ]
    tried = {"ac": True in ac_options, "offload": allow_offload}
    message = _nothing_fits(model, hardware, base, closest[0], headroom, world, tried)
    return PlanResult(closest, None, rejected_list, message)


def _nothing_fits(model, hardware, base, smallest: Candidate, headroom, world, tried) -> str:
    """One line: the smallest memory any layout needs, and what would help."""
    per_param = sum(state_bytes(base.precision, base.optimizer))
    states = per_param * model.num_params()
    helps = [f"more devices (the model states alone are {_gib(states)} GiB in total"]
    if hardware.memory_gib:
        usable = hardware.memory_gib * GIB * headroom
        helps[0] += f", {math.ceil(states / usable)} devices' worth"
    helps[0] += ")"
    if not tried["ac"]:
        helps.append("activation checkpointing")
    if not tried["offload"]:
        helps.append("CPU offload")
    if smallest.settings.micro_batch_size == 1:
        helps.append(f"a shorter seq_len than {base.seq_len}")
    return (
        f"no layout fits on {world} x {hardware.name} devices: the smallest, "
        f"{smallest.describe()}, {smallest.reason}; would help: " + ", ".join(helps)
    )


def _complexity(c: Candidate) -> int:
    lay, st = c.layout, c.settings
    hybrid = lay.dp_replicate > 1 and lay.dp_shard > 1
    return (
        (lay.tp > 1)
        + (lay.pp > 1)
        + (lay.dp_shard > 1)
        + hybrid
        + st.activation_checkpointing
        + 2 * st.offload
    )


def _rank(c: Candidate):
    return (c.time.step_seconds, _complexity(c), -c.settings.micro_batch_size, c.memory.total)


def _gib(nbytes: float | None) -> str:
    return "?" if nbytes is None else f"{nbytes / GIB:.1f}"
