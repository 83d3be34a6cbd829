"""Benchmark of the five pipeline schedules (not a test): bubble and step time at pp=2 and pp=4.

    python bench/schedules.py --repeats 5 --steps 3

Two measurements, because a CPU with fewer free cores than ranks cannot show a bubble:

1. Simulated bubble: torch's own action table of each schedule (which rank runs which forward,
   backward, input-gradient or weight-gradient action, in order) replayed with the costs
   F : I : W = 1 : 1 : 1 (a full backward B = I + W = 2), no communication time. Each action
   starts when its rank is free and its inputs exist (F after the previous stage's F of that
   microbatch; B or I after the next stage's B or I; W after its own I). Bubble = idle share of
   ranks x makespan.
2. Measured: `pp` gloo ranks (OMP_NUM_THREADS=1) train a stack of 8 Linear(512)+GELU layers
   cut into pp x v stages, 8 microbatches of 64 rows, every schedule interleaved inside each
   repeat. Step time is the median over steps of the slowest rank; busy = the main thread's
   CPU time (the autograd engine's work; gloo waits use none), measured idle share = 1 - busy
   / step on the busiest rank. Meaningful only when every rank has a core of its own.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SCHEDULES = {  # name: stages per rank
    "GPipe": 1,
    "1F1B": 1,
    "Interleaved1F1B": 2,
    "InterleavedZeroBubble": 2,
    "ZBVZeroBubble": 2,
}
COST = {"F": 1.0, "I": 1.0, "W": 1.0, "B": 2.0}


def action_table(
    schedule: str, pp: int, microbatches: int, stages_per_rank: int | None = None
) -> list[list[tuple[str, int, int]]]:
    """Per rank, its compute actions in order, as (kind, stage, microbatch).

    The multi-stage schedules come from torch's own table. For GPipe and 1F1B torch's table
    builder mislabels ranks (it mocks one stage at rank 0), so their standard orders are
    written out: GPipe runs every forward, then every backward; 1F1B rank r runs pp - 1 - r
    forwards, then alternates one forward and one backward, then the remaining backwards.
    """
    m = microbatches
    if schedule == "GPipe":
        return [
            [("F", r, i) for i in range(m)] + [("B", r, i) for i in range(m)] for r in range(pp)
        ]
    if schedule == "1F1B":
        table = []
        for r in range(pp):
            warm = min(pp - 1 - r, m)
            row = [("F", r, i) for i in range(warm)]
            for i in range(m - warm):
                row += [("F", r, warm + i), ("B", r, i)]
            row += [("B", r, i) for i in range(m - warm, m)]
            table.append(row)
        return table
    from lightning_dist._compat import schedule_ops_api

    table = schedule_ops_api()(schedule, pp, microbatches, stages_per_rank or SCHEDULES[schedule])
    return [
        [
            (a.computation_type.value, a.stage_index, a.microbatch_index)
            for a in row
            if a is not None and a.computation_type.value in COST
        ]
        for row in table
    ]


def peak_inflight(schedule: str, pp: int, microbatches: int, stages_per_rank: int) -> list[int]:
    """Per rank, the most chunk-microbatches whose activations it holds in `schedule`'s action
    table: forwards run less backwards finished (B, or W, the weight-gradient half that ends a
    zero-bubble backward)."""
    peaks = []
    for row in action_table(schedule, pp, microbatches, stages_per_rank):
        held = peak = 0
        for kind, _, _ in row:
            held += 1 if kind == "F" else -1 if kind in ("B", "W") else 0
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def simulated_bubble(schedule: str, pp: int, microbatches: int) -> float:
    """Idle share of the ranks over the makespan of `schedule`'s action table (see above)."""
    queues = action_table(schedule, pp, microbatches)
    n_stages = pp * SCHEDULES[schedule]
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * pp
    pos = [0] * pp
    busy = 0.0
    while any(pos[r] < len(queues[r]) for r in range(pp)):
        progressed = False
        for r in range(pp):
            while pos[r] < len(queues[r]):
                kind, s, m = queues[r][pos[r]]
                back = "B" if ("B", s + 1, m) in done else "I"
                needs = {
                    "F": [("F", s - 1, m)] if s > 0 else [],
                    "B": [("F", s, m)] + ([(back, s + 1, m)] if s < n_stages - 1 else []),
                    "I": [("F", s, m)] + ([(back, s + 1, m)] if s < n_stages - 1 else []),
                    "W": [("I", s, m)],
                }[kind]
                if any(n not in done for n in needs):
                    break
                start = max([free[r]] + [done[n] for n in needs])
                free[r] = done[(kind, s, m)] = start + COST[kind]
                busy += COST[kind]
                pos[r] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"{schedule}: the action table deadlocks in the simulation")
    return 1 - busy / (pp * max(free))


def _stage_modules(pp: int, v: int, rank: int, schedule: str, dim: int, layers: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    chunks = [
        nn.Sequential(
            *[m for _ in range(layers // (pp * v)) for m in (nn.Linear(dim, dim), nn.GELU())]
        )
        for _ in range(pp * v)
    ]
    if v == 1:
        mine = [rank]
    elif schedule == "ZBVZeroBubble":  # V shape: rank r holds stages r and 2pp - 1 - r
        mine = [rank, 2 * pp - 1 - rank]
    else:  # looped: rank r holds stages r, r + pp, ...
        mine = [rank + i * pp for i in range(v)]
    return [(i, chunks[i]) for i in mine]


def _worker(rank: int, pp: int, args, out: dict) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import get_schedule_class

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port + pp))
    dist.init_process_group("gloo", rank=rank, world_size=pp)
    device = torch.device("cpu")
    rows = args.microbatches * args.rows
    x = torch.randn(rows, args.dim)
    y = torch.randn(rows, args.dim)
    runs = {}
    for name, v in SCHEDULES.items():
        stages = [
            PipelineStage(mod, i, pp * v, device)
            for i, mod in _stage_modules(pp, v, rank, name, args.dim, args.layers)
        ]
        cls = get_schedule_class(name)
        loss_fn = torch.nn.functional.mse_loss
        arg = stages[0] if v == 1 else stages
        runs[name] = (cls(arg, args.microbatches, loss_fn=loss_fn, scale_grads=False), stages)

    def one_step(name):
        schedule, stages = runs[name]
        first = any(s.is_first for s in stages)
        last = any(s.is_last for s in stages)
        dist.barrier()
        wall, cpu = time.perf_counter(), time.thread_time()
        schedule.step(*([x] if first else []), **({"target": y} if last else {}))
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        for s in stages:
            s.submod.zero_grad(set_to_none=True)
        return wall, cpu

    for name in runs:  # warm-up
        one_step(name)
    steps = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name in runs:
            for _ in range(args.steps):
                steps[name].append(one_step(name))
    gathered = [None] * pp
    dist.all_gather_object(gathered, steps)
    if rank == 0:
        out.update({"ranks": gathered})
    dist.destroy_process_group()


def measure(pp: int, args) -> dict[str, tuple[float, float, float, float]]:
    """{schedule: (median step s, min, max, measured bubble)} over `pp` spawned ranks."""
    import torch.multiprocessing as mp

    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_worker, args=(pp, args, out), nprocs=pp, join=True)
    ranks = out["ranks"]
    result = {}
    for name in SCHEDULES:
        n = len(ranks[0][name])
        walls = [max(r[name][i][0] for r in ranks) for i in range(n)]
        busiest = [max(r[name][i][1] for r in ranks) for i in range(n)]
        per_repeat = [statistics.median(walls[i : i + args.steps]) for i in range(0, n, args.steps)]
        bubble = 1 - statistics.median(busiest) / statistics.median(walls)
        result[name] = (statistics.median(walls), min(per_repeat), max(per_repeat), bubble)
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pp", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--rows", type=int, default=64, help="rows per microbatch")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--port", type=int, default=29610)
    parser.add_argument("--simulate-only", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(
        "| pp | schedule | v | simulated bubble (F:I:W = 1:1:1) | analytic (p-1)/(m+p-1) "
        "| measured step (s), median (min-max of repeats) | measured idle share |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for pp in args.pp:
        measured = {} if args.simulate_only else measure(pp, args)
        for name, v in SCHEDULES.items():
            sim = simulated_bubble(name, pp, args.microbatches)
            analytic = (pp - 1) / (args.microbatches + pp - 1)
            cells = "n/a | n/a"
            if name in measured:
                med, lo, hi, bub = measured[name]
                cells = f"{med:.3f} ({lo:.3f}-{hi:.3f}) | {bub:.2f}"
            print(f"| {pp} | {name} | {v} | {sim:.3f} | {analytic:.3f} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
