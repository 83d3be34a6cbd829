"""Dry run at full scale in one CPU process: one rank of a planned world, built by the real code.

The rank joins torch's fake process group with the plan's world size and rank, builds the model
on the meta device and applies `parallelize()` to it exactly as the strategy does (the named
mesh, the TP plan, FSDP2 over the data-parallel sub-mesh, the pipeline cut), then materialises
it as fake tensors (shapes and dtypes, no storage) and runs its share of one optimizer step:
forward and backward of each micro-step, gradient clipping over the whole model, AdamW. Every
collective it issues is counted by the mesh dimension of its group, as bytes per rank by the
caller's ring rule (`planner.traffic.ring_volume`), and its parameter, gradient and optimizer
bytes are read off its shards.

Only the first two micro-steps of a step run: every later one issues what the second did (the
same state: gradients accumulated, FSDP syncing each micro-step), so a step's traffic is the
first's + (accumulate - 1) x the second's + the optimizer step's.

What the fake backend cannot run: the pipeline's point-to-point exchange (the schedule's
shape inference sends pickled metadata, which a fake group never delivers). A pipeline rank's
chunks therefore run on their own, forward and backward in the order its schedule runs them
(`_actions`), fed fake inputs of the boundary shape; what it would send is the bytes
of its real outputs (forward) and input gradients (backward). FSDP's no-sync between
microbatches follows `torch.distributed.pipelining`'s stage: gradients are reduced and
resharded only in the last microbatch's backward.

Context parallelism runs as training feeds it (this rank's chunks of each sequence at their true
positions). A mixture of experts routes as a balanced router would (`dry_run_experts.py`): the
routing needs values, which fake tensors do not hold.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lightning_dist._compat import (
    clear_dtensor_caches,
    fake_tensor_mode,
    pipeline_action_types,
    register_fake_backend,
)
from lightning_dist.layout import Layout
from lightning_dist.measure.collective_counter import CollectiveCounter, Traffic, tensor_bytes
from lightning_dist.parallel.sharded_optimizer import ShardedOptimizer

DRY_RUN_SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B")
"""Schedules whose action tables hold only whole forwards and backwards (no split I/W)."""


@dataclass
class RankDryRun:
    """What one rank holds and sends in one optimizer step."""

    rank: int
    coordinate: dict[str, int]
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    traffic: Traffic
    micro_steps_run: int
    seconds: float

    @property
    def model_state_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


@contextlib.contextmanager
def fake_world(world_size: int, rank: int):
    """torch's fake process group as the default group: collectives return at once, untouched."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("a dry run needs a process without a process group")
    register_fake_backend()
    dist.init_process_group("fake", store=dist.HashStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        clear_dtensor_caches()  # the next rank's meshes are equal to this one's


def each_in_a_fresh_process(
    function: Callable[[int], RankDryRun], ranks: list[int]
) -> list[RankDryRun]:
    """`function(rank)` for each rank, each in a forked process of its own (as many at once as
    there are cores). A process holds one fake world: torch keeps meshes and their groups by
    name, and a second world in the same process resolves the first's names and fails."""
    workers = max(1, min(len(ranks), os.cpu_count() or 1))
    with multiprocessing.get_context("fork").Pool(workers, maxtasksperchild=1) as pool:
        return pool.map(function, ranks, chunksize=1)


def mesh_groups(mesh, layout: Layout, parts=()) -> dict[str, tuple[str, int]]:
    """Group name -> (mesh dimension, size) for every dimension above size 1, and the world
    (gradient clipping's all-reduce of the squared norm); then those of the meshes the
    parameters of `parts` live on: FSDP's dp_shard x cp flattened (`dp_shard_cp`), expert
    parallelism's `ep`, and the experts' FSDP group, named as the planner names the traffic it
    carries (the shard dimension's: `planner.traffic.DPVolumes.expert_gather`)."""
    import torch.distributed as dist

    dims = {}
    for dim, size in layout.degrees().items():
        if size > 1:
            dims[mesh[dim].get_group().group_name] = (dim, size)
    renamed = {"dp_shard_mod_ep": "dp_shard_cp" if layout.cp > 1 else "dp_shard"}
    for part in parts:
        for param in part.parameters():
            param_mesh: Any = getattr(param, "device_mesh", None)
            names = param_mesh.mesh_dim_names if param_mesh is not None else None
            for i, name in enumerate(names or ()):
                if param_mesh.size(i) > 1:
                    group = param_mesh.get_group(name).group_name
                    dims.setdefault(group, (renamed.get(name, name), param_mesh.size(i)))
    # A dimension over every rank is the world's group: its name wins.
    dims.setdefault(dist.group.WORLD.group_name, ("world", layout.world_size))
    return dims


def _local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def _optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The optimizer's states; under ZeRO-1 also the flat slices of the parameters it steps
    (`ShardedOptimizer`: memory it holds between steps beside the model's parameters)."""
    slices = [f.shard for f in optimizer.flat] if isinstance(optimizer, ShardedOptimizer) else []
    return _local_bytes(slices) + _local_bytes(
        v
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )


def dry_run_rank(
    build_model: Callable[[], nn.Module],
    layout: Layout,
    rank: int,
    *,
    options,
    precision: str,
    micro_batch_size: int,
    seq_len: int,
    accumulate: int,
    ring_volume: Callable[[str, float, int], float],
    grad_clip: float | None = 1.0,
) -> RankDryRun:
    """Build global `rank` of `layout` on the fake group and run one optimizer step.

    `build_model()` builds the single-device model (a `Transformer`: it has `args`) on the
    current (meta) device; `options` are the strategy's, their dtype knobs resolved as the
    target device resolves them; `micro_batch_size` sequences of `seq_len` tokens per micro-step
    (under PP: per pipeline microbatch), `accumulate` micro-steps per optimizer step;
    `ring_volume(kind, nbytes, n)` turns a collective into bytes per rank (the planner's
    `planner.traffic.ring_volume`, passed in: parallel/ does not import the planner).
    """
    from lightning_dist.measure.fake_routing import balance_routing
    from lightning_dist.parallel.clip import clip_grad_norm_global
    from lightning_dist.parallel.context_parallel import chunk_positions
    from lightning_dist.parallel.parallelize import model_parts, parallelize
    from lightning_dist.parallel.tp import loss_parallel_context, uses_sequence_parallel

    if layout.pp > 1 and layout.schedule not in DRY_RUN_SCHEDULES:
        raise ValueError(
            f"the dry run drives the pipeline schedules {', '.join(DRY_RUN_SCHEDULES)}; "
            f"schedule={layout.schedule} splits backward into input and weight halves"
        )
    started = time.perf_counter()
    with fake_world(layout.world_size, rank), warnings.catch_warnings():
        # Sequence parallelism tells its saved tensors apart by storage; fake ones have none.
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        mesh = layout.build_mesh("cpu")
        with torch.device("meta"):
            model = build_model()
        args, tp = model.args, options.tp
        sp = layout.tp > 1 and uses_sequence_parallel(model, tp.sequence_parallel, tp.tp_plan)
        model = parallelize(
            model, mesh, layout, device=torch.device("cpu"), options=options, precision=precision
        )
        parts = model_parts(model)
        for part in parts:
            balance_routing(part)
        counter = CollectiveCounter(mesh_groups(mesh, layout, parts), ring_volume)
        # Context parallelism: this rank's chunks of each sequence, at their true positions.
        local_len, positions = seq_len // layout.cp, None
        if layout.cp > 1:
            positions = chunk_positions(seq_len, layout.cp, mesh["cp"].get_local_rank())
        micro_steps: list[Traffic] = []
        with fake_tensor_mode():
            for part in parts:
                part.to_empty(device="cpu")
            params = [p for part in parts for p in part.parameters()]
            optimizer: torch.optim.Optimizer = torch.optim.AdamW(params)
            if options.optimizer_sharding.shard_optimizer:  # ZeRO-1: 1/dp of the states
                group = mesh["dp_replicate"].get_group()
                optimizer = ShardedOptimizer(optimizer, group, reduce_gradients=True)
            boundary = (micro_batch_size, local_len // (layout.tp if sp else 1), args.dim)
            for _ in range(min(accumulate, 2)):
                counter.traffic = Traffic()
                # As Lightning's step: the precision plugin's autocast around it all, backward
                # (the schedule's, under PP) included.
                with (
                    counter,
                    loss_parallel_context(layout.tp, tp.loss_parallel),
                    _autocast(precision),
                ):
                    if layout.pp > 1:
                        _pipeline_micro_step(
                            model,
                            layout,
                            mesh["pp"].get_local_rank(),
                            counter.traffic,
                            boundary,
                            local_len,
                            args.vocab_size,
                            _compute_dtype(options, layout),
                            positions,
                        )
                    else:
                        tokens = _tokens(micro_batch_size, local_len, args.vocab_size)
                        _loss(model(tokens, **_extra(positions)), tokens).backward()
                micro_steps.append(counter.traffic)
            counter.traffic = Traffic()
            with counter:
                stage_size = layout.dp * layout.tp
                if grad_clip and isinstance(optimizer, ShardedOptimizer):  # its reduced slices
                    optimizer.clip_grad_norm_(grad_clip, stage_size=stage_size)
                elif grad_clip:
                    clip_grad_norm_global(params, grad_clip, stage_size=stage_size)
                optimizer.step()
            states = (
                _local_bytes(params),
                _local_bytes(p.grad for p in params),
                _optimizer_bytes(optimizer),
            )
    traffic = micro_steps[0].combined(micro_steps[-1], accumulate - 1).combined(counter.traffic)
    return RankDryRun(
        rank=rank,
        coordinate=layout.coordinate(rank),
        param_bytes=states[0],
        grad_bytes=states[1],
        optimizer_bytes=states[2],
        traffic=traffic,
        micro_steps_run=len(micro_steps),
        seconds=time.perf_counter() - started,
    )


def _tokens(batch: int, seq_len: int, vocab_size: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch, seq_len))


def _extra(positions: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The model's keyword inputs: a context-parallel rank's token positions."""
    return {} if positions is None else {"positions": positions}


def _autocast(precision: str):
    """The autocast of a `*-mixed` precision, as Lightning's precision plugin enters it."""
    if precision == "bf16-mixed":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _compute_dtype(options, layout: Layout) -> torch.dtype:
    """The dtype of the residual stream between stages: FSDP's compute dtype (its parameters',
    which the embedding output takes), else fp32 (autocast keeps the residual adds in fp32)."""
    from lightning_dist.parallel.precision import parse_dtype

    dtype = parse_dtype(options.precision.param_dtype, "strategy.param_dtype")
    return dtype if layout.dp > 1 and dtype is not None else torch.float32


def _loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())


def _actions(model, layout: Layout, pp_rank: int) -> list[tuple[str, int, int]]:
    """(F or B, stage, microbatch) of this rank's step, in the order its schedule runs them.

    A multi-stage schedule runs its action table (`pipeline_order`). A single-stage one runs a
    loop of its own, which its table does not always match (torch 2.13's 1F1B table numbers the
    last stage's forwards from 1): GPipe every forward then every backward; 1F1B
    min(m, pp - r) forwards, then a backward and a forward in turn, then the backwards left.
    """
    m, kinds = layout.num_microbatches, pipeline_action_types()
    if layout.virtual_stages > 1:
        names = {kinds.FORWARD: "F", kinds.FULL_BACKWARD: "B"}
        order = [a for a in model.schedule.pipeline_order[pp_rank] if a is not None]
        return [
            (names[a.computation_type], a.stage_index, a.microbatch_index)
            for a in order
            if a.computation_type in names
        ]
    warmup = m if layout.schedule == "GPipe" else min(m, layout.pp - pp_rank)
    steps = [("F", mb) for mb in range(warmup)]
    for mb in range(m - warmup):
        steps += [("B", mb), ("F", warmup + mb)]
    steps += [("B", mb) for mb in range(m - warmup, m)]
    return [(kind, pp_rank, mb) for kind, mb in steps]


def _pipeline_micro_step(
    model,
    layout: Layout,
    pp_rank: int,
    traffic: Traffic,
    boundary: tuple[int, ...],
    seq_len: int,
    vocab_size: int,
    dtype: torch.dtype,
    positions: torch.Tensor | None,
) -> None:
    """One schedule step of this rank's chunks in its schedule's order (see module doc)."""
    from torch.distributed.fsdp import FSDPModule

    parts = dict(zip(model.stage_ids, model.parts, strict=True))
    last_stage, last_mb = layout.num_stages - 1, layout.num_microbatches - 1
    batch, extra = boundary[0], _extra(positions)
    saved: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}
    for kind, stage, mb in _actions(model, layout, pp_rank):
        part = parts[stage]
        if kind == "F":
            if stage == 0:
                inputs = None
                output = part(_tokens(batch, seq_len, vocab_size), **extra)
            else:
                inputs = torch.empty(boundary, dtype=dtype).requires_grad_()
                output = part(inputs, **extra)
            if stage == last_stage:
                output = _loss(output, _tokens(batch, seq_len, vocab_size))
            else:
                traffic.add("pp", tensor_bytes(output))  # sent to the next stage
            saved[(stage, mb)] = (inputs, output)
            continue
        inputs, output = saved.pop((stage, mb))
        if isinstance(part, FSDPModule):  # as torch's PipelineStage does: sync at the last
            last = mb == last_mb
            part.set_is_last_backward(last)
            part.set_reshard_after_backward(last)
            part.set_requires_gradient_sync(last)
        output.backward(None if output.dim() == 0 else torch.empty_like(output))
        if inputs is not None:
            traffic.add("pp", tensor_bytes(inputs.grad))  # sent to the previous stage
