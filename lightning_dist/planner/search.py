"""Search the layouts of a model on some hardware: what fits, what runs fastest, and why the rest
was rejected.

The layouts come from `space.py`, pruned so that 405B on 2048 nodes answers in a fraction of a
second; micro-batch sizes are the powers of two and three times the powers of two dividing the
per-rank batch (`space.micro_batch_values`), and a family stops growing them at the first that
does not fit. Layouts train.py cannot run yet (embedding-only and loss-only pipeline chunks:
`layout_checks.planner_only`) are ranked beside the others but never chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from lightning_dist.options import StrategyOptions
from lightning_dist.options.activation_checkpointing import (
    CheckpointChoice,
    parse_activation_checkpointing,
)
from lightning_dist.planner.estimate import (
    Candidate,
    NoLayoutFitsError,
    as_model_args,
    mixed_fit,
    mixed_split,
)
from lightning_dist.planner.families import Family, enumerate_families
from lightning_dist.planner.inputs import SearchInputs
from lightning_dist.planner.labels import describe
from lightning_dist.planner.layout_checks import (
    batch_problem,
    fit_problem,
    planner_only,
)
from lightning_dist.planner.memory import SHARDED_MODES, memory_per_device
from lightning_dist.planner.no_fit import Miss, closest_misses, no_layout_exists, nothing_fits
from lightning_dist.planner.settings import (
    DEFAULT_DP_OVERLAP,
    DEFAULT_HEADROOM,
    PLANNER_OPTIONS,
    SHARDING_MODES,
    TrainSettings,
    with_knobs,
)
from lightning_dist.planner.space import (
    micro_batch_values,
)
from lightning_dist.planner.timing import step_time

ZERO1_GAIN = 0.01
"""A ZeRO-1 family is listed beside DDP's on the same degrees only when it is this much faster
(its smaller optimizer states let a larger micro-batch or less recomputation fit); else it
would repeat DDP's row with the same time."""
CHECKPOINTING_CHOICES = (0, 2, "op", "op_alternate", "full")
"""The `activation_checkpointing` settings a search tries when none is pinned: off, every 2nd
block, op-level (selective), op-level saving every other matmul, and every block, from the least
recompute to the least memory."""


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
    activation_checkpointing: int | str | bool | None = None,
    allow_offload: bool = True,
    sharding_modes: tuple[str, ...] = SHARDING_MODES,
    schedules: tuple[str, ...] = ("1F1B", "Interleaved1F1B"),
    micro_batch_sizes: tuple[int, ...] | None = None,
    options: StrategyOptions | None = None,
    attention: str = "flash",
    efficiency: float | None = None,
    overlap: float = DEFAULT_DP_OVERLAP,
    headroom: float = DEFAULT_HEADROOM,
    compile_speedup: float | None = None,
    **knobs,
) -> PlanResult:
    """Enumerate layouts of `model` on `hardware`, keep those that fit, rank by step time.

    `activation_checkpointing=None` tries each of CHECKPOINTING_CHOICES; a setting (0, n,
    'full', 'op'; True/False for full/off) pins it. `options` are the strategy knobs every
    candidate starts from (PLANNER_OPTIONS when None), `knobs` change some by name
    (`compile=True`); the search varies the layout, the FSDP mode, checkpointing and offload,
    and keeps the rest (compile, sequence parallelism) as given. `compile_speedup` overrides
    COMPILE_SPEEDUP. Offload is tried for a
    sharded family only when nothing in that family fits without it. Each family (degrees plus
    FSDP mode) contributes its fastest fitting variant; ties go to the simpler layout, then the
    larger micro-batch. `rejected` lists {"family", "reason"} with the numbers. Raises
    ValueError for settings no layout could use (an unknown precision, seq_len past the model).
    """
    ours = not hasattr(model, "to_model_args")  # a Hugging Face spec describes its model
    model = as_model_args(model)
    per_node = hardware.resolved_devices()
    base = TrainSettings(
        global_batch_size=global_batch_size,
        seq_len=seq_len,
        precision=precision or hardware.precision,
        optimizer=optimizer,
        attention=attention,
        accelerator=hardware.accelerator,
        options=with_knobs(options or PLANNER_OPTIONS, knobs),
    )
    if seq_len > getattr(model, "max_seq_len", seq_len):
        raise ValueError(f"seq_len={seq_len} exceeds the model's max_seq_len={model.max_seq_len}")
    search = SearchInputs(
        model=model,
        hardware=hardware,
        expert_parallel=ours,
        base=base,
        per_node=per_node,
        world=per_node * hardware.num_nodes,
        ac_options=_checkpointing_options(activation_checkpointing),
        allow_offload=allow_offload,
        sharding_modes=sharding_modes,
        schedules=schedules,
        micro_batch_sizes=micro_batch_sizes,
        efficiency=efficiency,
        overlap=overlap,
        headroom=headroom,
        compile_speedup=compile_speedup,
    )
    families, min_batch = enumerate_families(search)
    best, misses, rejected = _search_families(search, families)
    rejected_list = [{"family": k, "reason": v} for k, v in rejected.items()]
    runnable = [c for c in best if c.planner_only is None]
    if runnable:
        ranked = sorted(best, key=_rank)
        chosen = next(i for i, c in enumerate(ranked) if c.planner_only is None)
        return PlanResult(ranked, chosen, rejected_list)
    if best:  # only layouts train.py cannot run yet fit: shown, none chosen
        ranked = sorted(best, key=_rank)
        message = f"only planner-only layouts fit ({ranked[0].planner_only})"
        return PlanResult(ranked, None, rejected_list, message)
    if not misses:
        message = no_layout_exists(search, min_batch, rejected)
        return PlanResult([], None, rejected_list, message)
    closest = closest_misses(search, misses)
    return PlanResult(closest, None, rejected_list, nothing_fits(search, closest[0]))


def _checkpointing_options(setting) -> tuple[CheckpointChoice, ...]:
    """The choices to try: CHECKPOINTING_CHOICES for None, else the one setting given."""
    if setting is None:
        return tuple(parse_activation_checkpointing(c) for c in CHECKPOINTING_CHOICES)
    if isinstance(setting, bool):
        setting = "full" if setting else 0
    return (parse_activation_checkpointing(setting),)


@dataclass
class _Tally:
    """What the search of one family has found so far."""

    fitting: list[Candidate] = field(default_factory=list)
    smallest: Miss | None = None
    first_problem: str | None = None


def _search_families(
    search: SearchInputs, families: list[Family]
) -> tuple[list[Candidate], list[Miss], dict[str, str]]:
    """Search each family in order. Returns the fastest fitting candidate of each family that
    has one, the smallest miss of each that does not, and {family: reason} for the rejected."""
    best: list[Candidate] = []
    misses: list[Miss] = []
    rejected: dict[str, str] = {}
    replicated: dict[str, Candidate] = {}  # DDP's fastest of each degrees
    for family in families:
        if family.problem is not None:
            rejected[family.key] = family.problem
            continue
        tally = _search_family(search, family)
        if tally.fitting and family.mode == "NO_SHARD":
            replicated[family.key] = min(tally.fitting, key=_rank)
        ddp = replicated.get(family.key.removesuffix(" SHARD_OPTIMIZER"))
        if tally.fitting and family.mode == "SHARD_OPTIMIZER" and ddp is not None:
            zero1 = min(tally.fitting, key=_rank)
            if zero1.time.step_seconds > (1 - ZERO1_GAIN) * ddp.time.step_seconds:
                rejected[family.key] = (
                    f"no faster than DDP on the same degrees (by search.ZERO1_GAIN = "
                    f"{ZERO1_GAIN:.0%}): ZeRO-1's reduce-scatter and all-gather run after "
                    "backward, where DDP's all-reduce hides under it"
                )
                continue
        if tally.fitting:
            # The family's fastest, and its fastest runnable one where that is slower.
            fastest = min(tally.fitting, key=_rank)
            best.append(fastest)
            runnable = [c for c in tally.fitting if c.planner_only is None]
            if fastest.planner_only and runnable:
                best.append(min(runnable, key=_rank))
        elif tally.smallest is not None:
            miss = tally.smallest
            misses.append(miss)
            rejected[family.key] = (
                f"{miss.problem}; smallest: {describe(miss.layout, miss.settings)}"
            )
        else:
            reason = tally.first_problem or "no micro-batch size divides the per-rank batch"
            rejected[family.key] = reason
    return best, misses, rejected


def _search_family(search: SearchInputs, family: Family) -> _Tally:
    """Estimate the variants of one family: each AC option, schedule and micro-batch size,
    first without offload and, only if none of those fits, with it."""
    tally = _Tally()
    sharded = family.mode in SHARDED_MODES
    offloads = (False, True) if (search.allow_offload and sharded) else (False,)
    for offload in offloads:
        if tally.fitting:
            break  # offload is only worth its host traffic when nothing else fits
        for ac in search.ac_options:
            for make_layout in family.makers:
                _sweep_micro_batches(search, family, make_layout, ac, offload, tally)
    return tally


def _sweep_micro_batches(
    search: SearchInputs,
    family: Family,
    make_layout,
    ac: CheckpointChoice,
    offload: bool,
    tally: _Tally,
) -> None:
    """Estimate one variant at each micro-batch size, smallest first, into `tally`; stop at the
    first that does not fit."""
    hardware = search.hardware
    base = search.base.with_knobs(activation_checkpointing=ac, cpu_offload=offload, **family.knobs)
    for mbs in search.micro_batch_sizes or micro_batch_values(family.per_rank):
        settings = replace(base, micro_batch_size=mbs, sharding=family.mode)
        layout, problem = _build_layout(make_layout, family.per_rank, settings)
        if layout is None:
            tally.first_problem = tally.first_problem or problem
            continue
        if hardware.mixed:  # each pipeline rank on its group, blocks by speed
            settings = mixed_split(search.model, hardware, layout, settings, search.headroom)
            mem, problem = mixed_fit(search.model, hardware, layout, settings, search.headroom)
        else:
            mem = memory_per_device(search.model, layout, settings)
            problem = fit_problem(mem, hardware, search.headroom)
        # Report the smallest device need; a host-memory miss only if all are.
        need = (bool(problem) and problem.startswith("offload"), mem.total)
        if tally.smallest is None or need < tally.smallest.need:
            tally.smallest = Miss(need, layout, settings, problem)
        if problem:
            break  # larger micro-batches only need more
        t = step_time(
            search.model,
            hardware,
            layout,
            settings,
            efficiency=search.efficiency,
            overlap=search.overlap,
            compile_speedup=search.compile_speedup,
        )
        only = planner_only(search.model, layout, settings)
        tally.fitting.append(Candidate(layout, settings, mem, t, True, None, only))


def _build_layout(make_layout, per_rank: int, settings: TrainSettings):
    """(layout, None) for this micro-batch size, or (None, why it cannot exist)."""
    try:
        layout = make_layout(max(per_rank // settings.micro_batch_size, 1))
    except ValueError as err:  # e.g. 1F1B with fewer microbatches than pp
        return None, str(err)
    problem = batch_problem(layout, settings)
    if problem:
        return None, problem
    return layout, None


def _complexity(c: Candidate) -> int:
    """How many parallelisms and memory savers a candidate stacks (offload counts double)."""
    lay, st = c.layout, c.settings
    hybrid = lay.dp_replicate > 1 and lay.shard_size > 1
    return (
        (lay.tp > 1)
        + (lay.pp > 1)
        + (lay.cp > 1)
        + (lay.dp_shard > 1)
        + hybrid
        + st.activation_checkpointing.enabled
        + (st.sharding == "SHARD_OPTIMIZER")
        + 2 * st.offload
    )


def _rank(c: Candidate):
    """Sort key: fastest step, then simplest layout, then largest micro-batch, then least memory."""
    return (c.time.step_seconds, _complexity(c), -c.settings.micro_batch_size, c.memory.total)
