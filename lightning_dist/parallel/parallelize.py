"""`parallelize()`: apply a layout to a model, in the fixed order TP -> EP -> CP -> AC ->
compile -> FSDP -> pipeline.

The pipeline cut comes first in the code because every later step is applied to each stage
module on its own (a stage is a copy of the model with the other layers removed), but it changes
no parameter: within each stage the order is tensor parallelism over `tp` (a mixture of
experts' feed-forward layers replicated over it), expert parallelism over `ep` (ranks of
dp_shard; `parallel/expert_parallel.py`), context parallelism over `cp` (the attention step;
`parallel/context_parallel.py`), activation checkpointing, per-block compilation
(`parallel/compile.py`), then FSDP2 over the data-parallel and context-parallel ranks (dp_shard
x cp, flattened; the experts over the dp_shard / ep ranks that hold the same ones); the stages
are then wrapped in `torch.distributed.pipelining` stages and a schedule.

Given a materialised model (the same full weights on every rank) each rank keeps exactly its
slice of them, so the result computes what the single-device model computes. Given a meta
model it allocates nothing; the caller materialises each stage (see `model_parts`).
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch import nn

from lightning_dist._compat import flatten_mesh
from lightning_dist.layout import Layout
from lightning_dist.models.moe import moe_layers
from lightning_dist.options import StrategyOptions
from lightning_dist.parallel.activation_checkpoint import apply_activation_checkpointing
from lightning_dist.parallel.compile import apply_compile
from lightning_dist.parallel.context_parallel import attach_context_parallel
from lightning_dist.parallel.expert_parallel import (
    apply_expert_fsdp,
    apply_expert_parallel,
    expert_mesh,
    experts_fsdp_mesh,
    replicate_over_tp,
)
from lightning_dist.parallel.float8 import (
    apply_float8,
    check_float8_all_gather,
    gather_float8_as_bytes,
)
from lightning_dist.parallel.fsdp import apply_fsdp, find_block_types, fsdp_kwargs
from lightning_dist.parallel.pipeline import PipelinedModel, stage_modules
from lightning_dist.parallel.tp import apply_tp, uses_sequence_parallel

log = logging.getLogger(__name__)


def dp_mesh(mesh, layout: Layout, *, shard_optimizer: bool = False):
    """The sub-mesh FSDP shards over: 1-D `dp_shard` (FSDP), or 2-D (replicate, shard) for
    HSDP; under context parallelism the shard dimension is dp_shard x cp, flattened into
    `dp_shard_cp` (the cp ranks hold the same weights, so they shard them too). Under ZeRO-1
    (`shard_optimizer`, dp_shard x cp = 1) `dp_shard` alone: FSDP2 would all-reduce the
    gradients over dp_replicate, which the optimizer reduce-scatters instead
    (`parallel/gradient_reduction.py`); each replica's FSDP is then one rank, which keeps its
    mixed precision and parameter form and communicates nothing."""
    if shard_optimizer:
        return mesh["dp_shard"]
    shard = "dp_shard"
    if layout.cp > 1:
        shard = "dp_shard_cp"
        flat = flatten_mesh(mesh, ("dp_shard", "cp"), shard)
        if layout.dp_replicate == 1:
            return flat
    if layout.dp_replicate > 1:
        with warnings.catch_warnings():
            # torch 2.13 warns that slicing a flattened dimension from the root will be
            # deprecated; it has no other public way to pair it with dp_replicate for HSDP.
            warnings.filterwarnings("ignore", "Slicing a flattened dim", UserWarning)
            return mesh["dp_replicate", shard]
    return mesh[shard]


def parallelize(
    model: nn.Module,
    mesh,
    layout: Layout,
    *,
    device: torch.device,
    options: StrategyOptions | None = None,
    precision: str = "32-true",
) -> nn.Module:
    """Apply `layout` over the named 4-D `mesh` (see `Layout.build_mesh`); return the model.

    Without pipeline parallelism the result is `model`, sharded in place. With it, a
    `PipelinedModel` holding this rank's stages; call it as `model(inputs, target, loss_fn)`.
    `options` holds every knob (lightning_dist/options/: the TP plan and sequence/loss
    parallelism, activation checkpointing, compile, FSDP2, the pipeline split); `precision` is
    the Trainer's, which FSDP's mixed-precision policy follows.
    """
    options = options or StrategyOptions()
    fsdp = fsdp_kwargs(options, precision=precision, device_type=device.type)
    pipelined = layout.pp > 1
    experts = bool(moe_layers(model))  # of the whole model, before a pipeline cuts it
    if pipelined:
        # A stage runs forward and backward for every microbatch of a step: resharding after
        # each forward would all-gather the stage again for the next microbatch (the dry run
        # measured 10x the step's gather traffic on Llama 3 405B, pp=16). The stage stays
        # gathered until its last backward instead, as torchtitan does under PP.
        fsdp["reshard_after_forward"] = False
        parts = stage_modules(
            model, layout, mesh["pp"].get_local_rank(), options.pipeline.split_points
        )
    else:
        parts = [(0, model)]
    tp = options.tp
    sequence_parallel = layout.tp > 1 and uses_sequence_parallel(
        model, tp.sequence_parallel, tp.tp_plan
    )
    # One split of dp_shard into (dp_shard_mod_ep, ep) for every stage: it makes new groups.
    ep_mesh = expert_mesh(mesh, layout) if layout.ep > 1 else None
    gather_float8 = options.float8.float8_all_gather and layout.shard_size > 1
    for _, part in parts:
        # The block classes are found before checkpointing wraps them, so FSDP shards the same
        # blocks whether or not they are checkpointed.
        blocks = find_block_types(part, options.sharding.auto_wrap)
        apply_float8(
            part, options.float8.float8, device_type=device.type, all_gather=gather_float8
        )  # parts are not Linears
        if layout.tp > 1:
            apply_tp(
                part,
                mesh["tp"],
                plan=tp.tp_plan,
                loss_parallel=tp.loss_parallel,
                sequence_parallel=sequence_parallel,
                strict=not pipelined,
            )
            if experts:
                replicate_over_tp(part, mesh["tp"], sequence_parallel=sequence_parallel)
        if ep_mesh is not None:
            apply_expert_parallel(part, ep_mesh["ep"])
        if layout.cp > 1:
            attach_context_parallel(part, options.cp.cp_mode, mesh["cp"].get_group())
            log.info("Applied context parallelism: cp=%d, %s", layout.cp, options.cp.cp_mode)
        apply_activation_checkpointing(
            part, blocks, every_n=options.checkpointing.activation_checkpointing
        )
        if options.compile.backend is not None:
            apply_compile(
                part, blocks, backend=options.compile.backend, tensor_parallel=layout.tp > 1
            )
        if layout.dp * layout.cp > 1:
            if gather_float8:
                check_float8_all_gather(part, layout.shard_size)
            if ep_mesh is not None:  # before the blocks' units, which then leave them out
                apply_expert_fsdp(
                    part,
                    experts_fsdp_mesh(ep_mesh, layout),
                    divide_factor=layout.dp * layout.cp,
                    **{
                        k: fsdp[k] for k in ("reshard_after_forward", "mp_policy", "offload_policy")
                    },
                )
            zero1 = options.optimizer_sharding.shard_optimizer
            apply_fsdp(
                part, dp_mesh(mesh, layout, shard_optimizer=zero1), block_types=blocks, **fsdp
            )
            if gather_float8 and torch.distributed.get_backend() != "nccl":  # NCCL has float8
                gather_float8_as_bytes(part)
    if not pipelined:
        return model
    log.info(
        "Applied pipeline parallelism: pp=%d, %s, %d microbatches",
        layout.pp,
        layout.schedule,
        layout.num_microbatches,
    )
    return PipelinedModel(parts, layout, mesh["pp"].get_group(), device, experts=experts)


def shard_children(
    module: nn.Module,
    mesh,
    *,
    device: torch.device,
    options: StrategyOptions,
    precision: str = "32-true",
) -> nn.Module:
    """Shard a module that is not a single model (a LightningModule holding its layers): each
    child that holds parameters becomes FSDP units, with the blocks inside checkpointed and
    sharded one by one. The module itself must hold no parameters of its own."""
    own = [name for name, _ in module.named_parameters(recurse=False)]
    if own:
        raise ValueError(
            f"cannot shard parameters held by {type(module).__name__} itself "
            f"({', '.join(own)}); move them into a submodule, or build the model in "
            "configure_model() and pass it to self.trainer.strategy.parallelize_model()"
        )
    fsdp = fsdp_kwargs(options, precision=precision, device_type=device.type)
    block_types = find_block_types(module, options.sharding.auto_wrap)
    every_n = options.checkpointing.activation_checkpointing
    for child in module.children():
        # Containers have no forward of their own to hook, so their members are the units.
        is_container = isinstance(child, (nn.ModuleList, nn.ModuleDict))
        for unit in child.children() if is_container else [child]:
            if any(True for _ in unit.parameters()):
                apply_activation_checkpointing(unit, block_types, every_n=every_n)
                if options.compile.backend is not None:
                    apply_compile(unit, block_types, backend=options.compile.backend)
                apply_fsdp(unit, mesh, block_types=block_types, **fsdp)
    return module


def model_parts(model: nn.Module) -> list[nn.Module]:
    """The stage modules of a `PipelinedModel`, or `[model]`."""
    return list(model.parts) if isinstance(model, PipelinedModel) else [model]


def init_shards(parts: list[nn.Module], layout: Layout, rank: int, *, device, seed: int) -> None:
    """Allocate and initialise each part's own shards on `device` (no full copy anywhere).

    One seed per distinct shard: the data-parallel replicas (dp_replicate) draw the same values,
    every other rank different ones (or TP and CP shards would repeat each other). The weights
    then differ from a single process's; `init_sharded=false` keeps parity instead."""
    c = layout.coordinate(rank)
    shard = (c["pp"] * layout.dp_shard + c["dp_shard"]) * layout.cp + c["cp"]
    shard_id = shard * layout.tp + c["tp"]
    for part in parts:
        part.to_empty(device=device)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed + 1_000_003 * shard_id)
            part.init_weights()


def optimizers_to_device(optimizers, device: torch.device) -> None:
    """Move any optimizer state tensors to `device` (a restored state may sit elsewhere)."""
    for optimizer in optimizers:
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device != device:
                    state[key] = value.to(device)
