"""Mixed hardware in the planner: which node group each pipeline rank runs on, and a layer split
in proportion to each stage's speed, within each stage's memory.

A spec with node groups (`HardwareSpec.groups`) maps the run's nodes to its groups in order, and
the mesh puts pp outermost, so pipeline rank r holds ranks [r W / pp, (r + 1) W / pp) of the W
ranks: a layout runs on mixed hardware when each pipeline rank's ranks lie in one group (pp = 1
spans every group: data parallelism across groups runs at the slowest group's speed, every rank
doing the same work). Plain Python, like the rest of planner/.
"""

from __future__ import annotations

import functools

from lightning_dist.planner.settings import DEFAULT_EFFICIENCY


def rank_groups(hardware, layout) -> list | None:
    """The node group (a `HardwareSpec`) of each pipeline rank, or None when a pipeline rank's
    ranks span two groups. One kind of node: the spec itself for every rank."""
    if not hardware.mixed:
        return [hardware] * layout.pp
    devices, world = hardware.resolved_devices(), hardware.world_size
    per_rank = world // layout.pp
    out = []
    for r in range(layout.pp):
        first, last = r * per_rank // devices, ((r + 1) * per_rank - 1) // devices
        name, group = hardware.node_group(first)
        if hardware.node_group(last)[0] != name:
            return None
        out.append(group)
    return out


def sustained_flops(spec, precision: str) -> float:
    """What `spec`'s matmuls sustain: its peak for `precision` times its matmul efficiency and
    the clock share its power limit leaves (a spec without a peak: 1, so that equal specs still
    split evenly)."""
    from lightning_dist.planner.device_rates import sustained_clock_share

    peak = spec.peak_flops(precision) or 1.0
    clock = sustained_clock_share(spec.power_w, spec.peak_tflops_bf16)
    return peak * clock * (spec.matmul_efficiency or DEFAULT_EFFICIENCY.get(spec.accelerator, 0.5))


def slowest(groups: list, precision: str):
    """The group whose matmuls sustain the least."""
    return min(groups, key=lambda g: sustained_flops(g, precision))


def speed_split(
    costs: list[float],
    speeds: list[float],
    first: float = 0.0,
    last: float = 0.0,
    caps: list[int] | None = None,
) -> list[int]:
    """Cut blocks of `costs` into len(speeds) contiguous non-empty stages, stage s running at
    `speeds[s]`, minimising the slowest stage's time (its blocks' costs, plus `first` on the
    first stage and `last` on the last, over its speed), each stage holding at most `caps[s]`
    blocks; return the first block of every stage but the first (`strategy.split_points`).
    ValueError when the caps leave no split. The search asks the same split thousands of times
    (424 distinct of 4335 calls planning llama3_70b on mixed_h100_a100): answers are cached."""
    return list(
        _speed_split(tuple(costs), tuple(speeds), first, last, tuple(caps) if caps else None)
    )


@functools.lru_cache(maxsize=4096)
def _speed_split(
    costs: tuple[float, ...],
    speeds: tuple[float, ...],
    first: float,
    last: float,
    caps: tuple[int, ...] | None,
) -> tuple[int, ...]:
    n, stages = len(costs), len(speeds)
    caps = caps or (n,) * stages
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        extra = (first if s == 1 else 0.0) + (last if s == stages else 0.0)
        for i in range(s, n - (stages - s) + 1):
            for j in range(max(s - 1, i - caps[s - 1]), i):
                value = max(best[s - 1][j], (prefix[i] - prefix[j] + extra) / speeds[s - 1])
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    if best[stages][n] == inf:
        raise ValueError(f"no split of {n} blocks into {stages} stages holds at most {caps} blocks")
    points, i = [], n
    for s in range(stages, 1, -1):
        i = cut[s][i]
        points.append(i)
    return tuple(points[::-1])


def mixed_problem(hardware, pp: int) -> str | None:
    """Why `pp` pipeline ranks cannot each run inside one node group of mixed hardware, or
    None (also for one kind of node, and for pp = 1)."""
    if not hardware.mixed or pp == 1:
        return None
    from lightning_dist.layout import Layout

    if (
        hardware.world_size % pp == 0
        and rank_groups(hardware, Layout(pp=pp, dp_shard=-1).resolve(hardware.world_size))
        is not None
    ):
        return None
    counts = ", ".join(f"{k} {g.num_nodes}" for k, g in hardware.groups.items())
    return (
        f"pp={pp} puts a pipeline rank on two node groups ({counts} nodes); use a pp whose "
        "ranks each lie in one group"
    )
