"""Communication vs compute, and the pipeline bubble, measured with torch.profiler.

Every `every_n_steps` optimizer steps (and once early, at `first_step`) one whole step is
profiled on every rank. From its events:

- communication = the union of the intervals in which collective work ran (gloo worker threads,
  NCCL kernels), whatever overlapped it;
- compute = the union of the intervals of computation (aten ops on the training thread on CPUs,
  where backward runs on that thread too; non-communication kernels on GPUs);
- exposed communication = communication during which no computation ran;
- idle (the pipeline bubble under PP) = the part of the pipeline schedule (marked with a profiler
  range by parallel/pipeline.py) in which this rank computed nothing; without PP, of the step;
- busy = the step minus exposed communication: what this rank spent on its own work. In a
  synchronous step every rank ends together, the fast ones waiting inside a collective for the
  slow one, so the rank with the largest busy time is the straggler.

Collectives are attributed to a mesh dimension by where they run: at start-up one tiny
collective per process group is profiled to learn which worker threads (or CUDA streams) serve
which dimension; point-to-point sends and receives are the pipeline's. Each dimension is also
labelled by the link it crosses on this rank, from the strategy's node map (its `placement`):
`intra_node` when this rank's group of it lies on one node, else `inter_node`; collectives of
no known dimension are `unattributed`. The time per link is the union of its dimensions' times.
"""

from __future__ import annotations

import re
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch.profiler import ProfilerActivity, profile, record_function

from lightning_dist._compat import flatten_mesh
from lightning_dist.callbacks.context import RunContext, StepClock, step_clock
from lightning_dist.callbacks.intervals import subtract, union_length, union_of
from lightning_dist.contract import contract_of
from lightning_dist.parallel.pipeline import SCHEDULE_MARKER
from lightning_dist.planner.timing import bubble_fraction
from lightning_dist.runtime.quiet import quiet_profiler
from lightning_dist.runtime.record import log_at_this_step

COMM_EVENT = re.compile(r"^(gloo|nccl):|nccl.*kernel|ncclDevKernel", re.IGNORECASE)
P2P_EVENT = re.compile(r"(send|recv)", re.IGNORECASE)
MARKER = "lightning_dist::profiled_step"


def _activities() -> list[ProfilerActivity]:
    quiet_profiler()  # before any profiler starts: no USDT lines on stderr
    cuda = torch.cuda.is_available()
    return [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]


def _interval(event: Any) -> tuple[float, float]:
    return (event.time_range.start, event.time_range.end)


def _where(event: Any) -> tuple[str, int]:
    return (str(event.device_type), int(event.thread))


def _mesh_groups(strategy: Any) -> dict[str, Any]:
    """Process group of each mesh dimension of size > 1; the world is 'dp' without a mesh."""
    mesh = getattr(strategy, "device_mesh", None)
    if mesh is None or not mesh.mesh_dim_names:
        return {"dp": None} if dist.is_initialized() and dist.get_world_size() > 1 else {}
    groups = {
        name: mesh.get_group(name)
        for name in mesh.mesh_dim_names
        if mesh.size(mesh.mesh_dim_names.index(name)) > 1
    }
    if "cp" in groups:  # FSDP shards over dp_shard x cp, one flattened group (parallelize.py)
        groups["dp_shard_cp"] = flatten_mesh(mesh, ("dp_shard", "cp"), "dp_shard_cp").get_group()
    model = getattr(strategy, "model", None)
    for module in model.modules() if model is not None else ():
        # Expert parallelism's all-to-alls run on the group its dispatch holds
        # (`parallel/expert_parallel.py`; ep borrows dp_shard's ranks: no mesh dimension). A
        # group of the same ranks as a mesh dimension's (ep = dp_shard) shares its threads, so
        # its traffic is counted there.
        group = getattr(getattr(module, "run_experts", None), "group", None)
        if group is not None:
            ranks = dist.get_process_group_ranks(group)
            if all(g is None or dist.get_process_group_ranks(g) != ranks for g in groups.values()):
                groups["ep"] = group
            break
    return groups


def locate_process_groups(strategy: Any) -> dict[tuple[str, int], str]:
    """Map each (device type, thread or stream) that runs collectives to its mesh dimension."""
    located: dict[tuple[str, int], str] = {}
    device = strategy.root_device
    for name, group in _mesh_groups(strategy).items():
        with profile(activities=_activities()) as prof:
            for _ in range(4):  # gloo spreads work over several threads: visit them all
                dist.all_reduce(torch.zeros(1, device=device), group=group)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        for event in prof.events():
            if COMM_EVENT.search(event.name) and not P2P_EVENT.search(event.name):
                located[_where(event)] = name
    return located


def dimension_links(strategy: Any) -> dict[str, str]:
    """The link (`intra_node` or `inter_node`) each mesh dimension's group of this rank
    crosses, from the strategy's node map; empty when the strategy has none."""
    placement = contract_of(strategy).placement
    if placement is None:
        return {}
    nodes = placement.nodes
    links = {}
    for name, group in _mesh_groups(strategy).items():
        ranks = dist.get_process_group_ranks(group) if group is not None else None
        links[name] = nodes.link(ranks if ranks is not None else range(len(nodes.node_of_rank)))
    return links


def _computes(event: Any, main_thread: int | None) -> bool:
    if COMM_EVENT.search(event.name):
        return False
    cuda = str(event.device_type).endswith("CUDA")
    return cuda or (event.thread == main_thread and event.name.startswith("aten::"))


def schedule_window(events: list[Any], main_thread: int | None) -> dict[str, float]:
    """Under PP: the length of this rank's pipeline schedule and the computation inside it,
    in seconds (empty without a schedule marker)."""
    marks = [e for e in events if e.name == SCHEDULE_MARKER]
    if not marks:
        return {}
    start = min(e.time_range.start for e in marks)
    end = max(e.time_range.end for e in marks)
    inside = [
        (max(s, start), min(e, end))
        for s, e in (_interval(ev) for ev in events if _computes(ev, main_thread))
        if e > start and s < end
    ]
    return {
        "schedule_seconds": (end - start) * 1e-6,
        "schedule_compute_seconds": union_length(inside) * 1e-6,
    }


def analyse_step(
    events: list[Any],
    located: dict[tuple[str, int], str],
    span: float,
    main_thread: int | None,
    links: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Communication, compute and idle time (seconds) of one profiled step; with `links`
    (dimension -> link) also the communication time over each link."""
    comm, compute, per_dim = [], [], {}
    for event in events:
        if COMM_EVENT.search(event.name):
            dim = "pp" if P2P_EVENT.search(event.name) else located.get(_where(event), "other")
            per_dim.setdefault(dim, []).append(_interval(event))
            comm.append(_interval(event))
        elif _computes(event, main_thread):
            compute.append(_interval(event))
    compute_union = union_of(compute)
    seconds = 1e-6  # the profiler reports microseconds
    comm_time = union_length(comm) * seconds
    compute_time = union_length(compute_union) * seconds
    exposed = sum(e - s for s, e in subtract(union_of(comm), compute_union)) * seconds
    by_link: dict[str, list[tuple[float, float]]] = {}
    for dim, intervals in per_dim.items():
        by_link.setdefault((links or {}).get(dim, "unattributed"), []).extend(intervals)
    return {
        "step_seconds": span,
        "comm_seconds": comm_time,
        "compute_seconds": compute_time,
        "exposed_comm_seconds": exposed,
        "comm_seconds_by_dim": {d: union_length(v) * seconds for d, v in per_dim.items()},
        **(
            {"comm_seconds_by_link": {k: union_length(v) * seconds for k, v in by_link.items()}}
            if links
            else {}
        ),
        "comm_compute_ratio": comm_time / compute_time if compute_time else None,
        "idle_fraction": max(0.0, 1.0 - compute_time / span) if span else None,
        "busy_seconds": max(0.0, span - exposed),
        **schedule_window(events, main_thread),
    }


class CommComputeMonitor(Callback):
    """Profiles one step every `every_n_steps`; logs `comm/*`, `stragglers/*` and, under PP,
    `bubble/*`."""

    def __init__(
        self,
        every_n_steps: int = 50,
        first_step: int = 2,
        warn_ratio: float = 0.3,
        straggler_ratio: float = 1.2,
        warn_min_flops_per_rank: float = 1e11,
    ) -> None:
        self.every_n_steps = every_n_steps
        self.first_step = first_step
        self.warn_ratio = warn_ratio
        self.straggler_ratio = straggler_ratio
        self.warn_min_flops_per_rank = warn_min_flops_per_rank
        """No warnings below this many model FLOPs per rank and step (the metrics are still
        logged): a smaller step is dominated by the fixed latency of each collective and by
        the OS's scheduling, and its ratios say nothing about the layout at scale."""
        self.context: RunContext | None = None
        self.measurements: list[list[dict[str, Any]]] = []
        """One entry per profiled step: the analysis of every rank, in rank order."""
        self._located: dict[tuple[str, int], str] = {}
        self._links: dict[str, str] = {}
        self.clock = StepClock()
        """The trainer's shared clock once training starts (`step_clock(trainer)`)."""
        self._prof = None
        self._started = 0.0

    def bind(self, context: RunContext) -> None:
        self.context = context

    def _profiled(self, step: int) -> bool:
        """Whether optimizer step `step` (1-based) is measured."""
        return step == self.first_step or (
            step > self.first_step and step % self.every_n_steps == 0
        )

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.clock = step_clock(trainer)
        self.clock.start(trainer)
        if dist.is_initialized():
            self._located = locate_process_groups(trainer.strategy)
            self._links = dimension_links(trainer.strategy)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._prof is None and self._profiled(trainer.global_step + 1):
            self._prof = profile(activities=_activities())
            self._prof.__enter__()
            with record_function(MARKER):  # marks the training thread in the profile
                pass
            self._started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.clock.tick(trainer, batch_idx) or self._prof is None:
            return
        span = self.clock.end_times[-1] - self._started  # the clock synchronised CUDA first
        self._prof.__exit__(None, None, None)
        events, self._prof = self._prof.events(), None
        main_thread = next((e.thread for e in events if e.name == MARKER), None)
        mine = analyse_step(events, self._located, span, main_thread, self._links)
        gathered = [mine]
        if dist.is_initialized() and dist.get_world_size() > 1:
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
        self.measurements.append(gathered)
        self._log(trainer, pl_module, gathered)

    def worth_warning(self, world_size: int) -> bool:
        """Whether a step does enough work per rank for its ratios to mean something."""
        if self.context is None:
            return True
        flops = self.context.flops_per_token * self.context.tokens_per_step / max(world_size, 1)
        return flops >= self.warn_min_flops_per_rank

    def _log(self, trainer: Any, pl_module: Any, per_rank: list[dict[str, Any]]) -> None:
        warn = trainer.is_global_zero and self.worth_warning(trainer.world_size)
        ratio = statistics.fmean(r["comm_compute_ratio"] or 0.0 for r in per_rank)
        exposed = statistics.fmean(r["exposed_comm_seconds"] for r in per_rank)
        # Straight to the loggers, at this step only: through `pl_module.log` a value logged
        # once stays in Lightning's step results and is written again at every later logging
        # step until the next profiled one, which draws a few samples as flat lines.
        metrics = {"comm/comm_compute_ratio": ratio, "comm/exposed_seconds": exposed}
        for dim, seconds in self.seconds_by_dim(per_rank).items():
            metrics[f"comm/{dim}_seconds"] = seconds
        for dim, dim_ratio in self.ratio_by_dim(per_rank).items():
            metrics[f"comm/{dim}_compute_ratio"] = dim_ratio
        for link, seconds in self.seconds_by_link(per_rank).items():
            metrics[f"comm/{link}_seconds"] = seconds
        stragglers = self.stragglers(per_rank)
        metrics["stragglers/slowest_rank"] = float(stragglers["slowest_rank"])
        metrics["stragglers/spread"] = stragglers["spread"]
        bubble = self.bubble(per_rank)
        if bubble:
            metrics["bubble/measured"] = bubble["measured"]
            metrics["bubble/theoretical"] = bubble["theoretical"]
        if trainer.is_global_zero:
            log_at_this_step(trainer, metrics)
        if warn and len(per_rank) > 1 and stragglers["spread"] > self.straggler_ratio:
            busy = stragglers["busy_seconds_per_rank"]
            rank_zero_warn(
                f"rank {stragglers['slowest_rank']} is a straggler at step {trainer.global_step}: "
                f"busy {max(busy) * 1e3:.1f} ms per step, {stragglers['spread']:.2f}x the median "
                f"{statistics.median(busy) * 1e3:.1f} ms"
            )
        if warn and ratio > self.warn_ratio:
            rank_zero_warn(
                f"communication takes {ratio:.0%} of compute time at step {trainer.global_step} "
                f"(above {self.warn_ratio:.0%}): see comm/*_seconds for the dimension to rethink"
            )

    @staticmethod
    def seconds_by_dim(per_rank: list[dict[str, Any]]) -> dict[str, float]:
        """Time in each mesh dimension's collectives, the mean over ranks."""
        dims = sorted({d for r in per_rank for d in r["comm_seconds_by_dim"]})
        return {
            dim: statistics.fmean(r["comm_seconds_by_dim"].get(dim, 0.0) for r in per_rank)
            for dim in dims
        }

    @staticmethod
    def seconds_by_link(per_rank: list[dict[str, Any]]) -> dict[str, float]:
        """Time in collectives over each link (intra_node, inter_node), the mean over ranks."""
        rows = [r.get("comm_seconds_by_link", {}) for r in per_rank]
        links = sorted({link for row in rows for link in row})
        return {link: statistics.fmean(row.get(link, 0.0) for row in rows) for link in links}

    @staticmethod
    def ratio_by_dim(per_rank: list[dict[str, Any]]) -> dict[str, float]:
        """Each dimension's communication over compute time, the mean over ranks (the parts
        may overlap one another, so they can add up to more than the total ratio)."""
        dims = sorted({d for r in per_rank for d in r["comm_seconds_by_dim"]})
        return {
            dim: statistics.fmean(
                r["comm_seconds_by_dim"].get(dim, 0.0) / r["compute_seconds"]
                if r["compute_seconds"]
                else 0.0
                for r in per_rank
            )
            for dim in dims
        }

    @staticmethod
    def stragglers(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
        """Per-rank busy time, the slowest rank, and its busy time over the median's."""
        busy = [r["busy_seconds"] for r in per_rank]
        median = statistics.median(busy)
        slowest = max(range(len(busy)), key=busy.__getitem__)
        return {
            "busy_seconds_per_rank": busy,
            "slowest_rank": slowest,
            "spread": busy[slowest] / median if median > 0 else 1.0,
        }

    def bubble(self, per_rank: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Measured idle fraction per pipeline stage next to the schedule's theoretical value."""
        layout = self.context.layout if self.context else None
        if layout is None or layout.pp == 1:
            return None
        # Every stage's step lasts as long as the longest schedule (the last stage returns
        # first, the first stage last), so idle time is measured against that common span.
        span = max(r.get("schedule_seconds", 0.0) for r in per_rank)
        idle = [
            1.0 - r["schedule_compute_seconds"] / span if span else r["idle_fraction"]
            for r in per_rank
        ]
        ranks_per_stage = len(per_rank) // layout.pp
        per_stage = [
            statistics.fmean(idle[stage * ranks_per_stage : (stage + 1) * ranks_per_stage])
            for stage in range(layout.pp)
        ]
        return {
            "measured": statistics.fmean(per_stage),
            "per_stage": per_stage,
            "theoretical": theoretical_bubble(layout),
        }

    def summary(self, world_size: int) -> dict[str, Any]:
        if not self.measurements:
            return {}
        last = self.measurements[-1]
        out: dict[str, Any] = {
            "comm": {
                "per_rank": last,
                "comm_compute_ratio": statistics.fmean(
                    r["comm_compute_ratio"] or 0.0 for r in last
                ),
                "exposed_comm_seconds": statistics.fmean(r["exposed_comm_seconds"] for r in last),
                "comm_compute_ratio_by_dim": self.ratio_by_dim(last),
                "comm_seconds_by_link": self.seconds_by_link(last),
                "warn_ratio": self.warn_ratio,
            }
        }
        out["stragglers"] = self.stragglers(last)
        bubbles = [b for b in map(self.bubble, self.measurements) if b]
        if bubbles:
            # One profiled step can catch the OS preempting a rank: report the median step.
            median = sorted(bubbles, key=lambda b: b["measured"])[(len(bubbles) - 1) // 2]
            out["bubble"] = {
                **median,
                "measured_per_profiled_step": [b["measured"] for b in bubbles],
            }
        return out


def theoretical_bubble(layout: Any) -> float:
    """The schedule's idle fraction for this layout (the planner's formula)."""
    return bubble_fraction(
        layout.schedule, layout.pp, layout.num_microbatches, layout.virtual_stages
    )
