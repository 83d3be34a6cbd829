"""FSDP2 as plain functions: find a model's transformer blocks and shard them with `fully_shard`.

`apply_fsdp(model, mesh, ...)` is the data-parallel dimension of every strategy that shards
parameters: `strategy=fsdp2` calls it on the whole mesh, the 3D strategy on its DP sub-mesh. The
block finder is shared with the FSDP1 strategy, whose auto-wrap policy needs the same classes.
No Lightning import here.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence

from torch import nn

from lightning_dist._compat import hf_block_class_names
from lightning_dist.options.knobs import check_reshard
from lightning_dist.parallel.fused import fused_shard_placement
from lightning_dist.parallel.precision import MixedDtypes, mixed_dtypes

log = logging.getLogger(__name__)

# Block classes wrapped by default: our decoder block; Hugging Face models name theirs in
# `_no_split_modules` (LlamaDecoderLayer, MistralDecoderLayer, ...).
KNOWN_BLOCKS = ("TransformerBlock",)


def block_classes_present(model: nn.Module) -> list[str]:
    """Names of the classes that look like repeated blocks, outermost first: those in HF's
    `_no_split_modules`, our `TransformerBlock`, and any class repeated in a ModuleList/Dict."""
    present = {type(m).__name__ for m in model.modules()}
    candidates: list[str] = []
    for module in model.modules():
        candidates += hf_block_class_names(module)
        if type(module).__name__ in KNOWN_BLOCKS:
            candidates.append(type(module).__name__)
        if isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            kinds = Counter(type(child).__name__ for child in module.children())
            candidates += [name for name, count in kinds.items() if count > 1]
    return [name for name in dict.fromkeys(candidates) if name in present]


def find_block_types(
    model: nn.Module, wanted: Iterable[str | type[nn.Module]] | None = None
) -> tuple[type[nn.Module], ...]:
    """The module classes to wrap (FSDP units) or checkpoint.

    `wanted=None` detects them (see `block_classes_present`); an empty list means none (the
    root only). A name or class that is not in the model raises ValueError listing the block
    classes that are.
    """
    by_name: dict[str, type[nn.Module]] = {}
    for module in model.modules():
        by_name.setdefault(type(module).__name__, type(module))
        by_name.setdefault(f"{type(module).__module__}.{type(module).__qualname__}", type(module))
    if wanted is None:
        return tuple(by_name[n] for n in block_classes_present(model))
    found, missing = [], []
    for item in wanted:
        key = item if isinstance(item, str) else f"{item.__module__}.{item.__qualname__}"
        (found if key in by_name else missing).append(by_name.get(key, key))
    if missing:
        blocks = block_classes_present(model) or sorted({type(m).__name__ for m in model.modules()})
        raise ValueError(
            f"auto-wrap class {', '.join(map(str, missing))} is not in the model "
            f"{type(model).__name__}; its block classes are: {', '.join(blocks)}. "
            "Set strategy.auto_wrap to one of them, or to null to detect them."
        )
    return tuple(dict.fromkeys(found))


def block_modules(model: nn.Module, block_types: Sequence[type[nn.Module]]) -> list[nn.Module]:
    """The outermost instances of `block_types` in `model`, in registration (= forward) order."""
    if not block_types:
        return []
    blocks, prefixes = [], []
    for name, module in model.named_modules():
        if isinstance(module, tuple(block_types)) and module is not model:
            if not any(name.startswith(p) for p in prefixes):
                blocks.append(module)
                prefixes.append(name + ".")
    return blocks


def apply_fsdp(
    model: nn.Module,
    mesh,
    *,
    reshard_after_forward: bool | int = True,
    mp_policy=None,
    offload_policy=None,
    prefetch_forward: int = 1,
    prefetch_backward: int = 1,
    block_types: Sequence[type[nn.Module]] | None = None,
) -> nn.Module:
    """Shard `model` with FSDP2: `fully_shard` on every block, then on the root.

    `mesh` is 1-D (FSDP: shard over all its ranks) or 2-D `(dp_replicate, dp_shard)` (HSDP:
    shard within a group, replicate across groups). `reshard_after_forward` is True (ZeRO-3),
    False (ZeRO-2: keep gathered parameters until backward) or an int (reshard to groups of that
    size). `prefetch_forward`/`prefetch_backward` are how many blocks ahead each block's
    all-gather is issued (0: FSDP2's implicit default). `block_types=None` detects the block
    classes. Returns `model`, sharded in place.
    """
    from torch.distributed.fsdp import fully_shard

    if mesh.ndim not in (1, 2):
        raise ValueError(f"apply_fsdp needs a 1-D or 2-D mesh, got {mesh.ndim}-D {mesh}")
    check_reshard(reshard_after_forward, mesh.size(mesh.ndim - 1))
    if prefetch_forward < 0 or prefetch_backward < 0:
        raise ValueError(
            f"prefetch_forward={prefetch_forward} and prefetch_backward={prefetch_backward} "
            "must be 0 or more"
        )
    if block_types is None:
        block_types = find_block_types(model)
    blocks = block_modules(model, block_types)
    # A fused projection split by tensor parallelism is sharded along its parts' rows
    # (parallel/fused.py); every other parameter along dim 0.
    placement = fused_shard_placement(model, mesh.size(mesh.ndim - 1))
    options = {
        "mesh": mesh,
        "mp_policy": mp_policy,
        "offload_policy": offload_policy,
        "shard_placement_fn": placement,
    }
    options = {k: v for k, v in options.items() if v is not None}
    for i, block in enumerate(blocks):
        # Backward starts with the last block, so resharding it after forward would only
        # all-gather it again at once.
        last = i == len(blocks) - 1
        fully_shard(block, reshard_after_forward=reshard_after_forward and not last, **options)
    # An output head that defers its logits is read by the loss after the forward
    # (lightning_dist.lm.chunked_loss), so the root unit that holds it stays gathered until
    # backward, which would all-gather it again first thing anyway.
    defers = any(getattr(m, "defers_logits", False) for m in model.modules())
    fully_shard(model, reshard_after_forward=reshard_after_forward and not defers, **options)
    set_prefetch(blocks, prefetch_forward, prefetch_backward)
    log.info(
        "Applied FSDP2 to %d %s blocks on a %s mesh (reshard_after_forward=%s)",
        len(blocks),
        "/".join(t.__name__ for t in block_types) or "no",
        tuple(mesh.shape),
        reshard_after_forward,
    )
    return model


def mixed_precision_policy(dtypes: MixedDtypes | None):
    """FSDP2's MixedPrecisionPolicy for resolved dtypes; None (plain fp32) stays None."""
    if dtypes is None:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=dtypes.compute, reduce_dtype=dtypes.reduce)


def set_prefetch(blocks: Sequence[nn.Module], forward: int, backward: int) -> None:
    """Explicit prefetching: each block's all-gather is issued `forward` blocks ahead in the
    forward pass and `backward` blocks ahead (in reverse order) in the backward pass."""
    for i, block in enumerate(blocks):
        if forward:
            ahead = list(blocks[i + 1 : i + 1 + forward])
            if ahead:
                block.set_modules_to_forward_prefetch(ahead)
        if backward:
            behind = list(reversed(blocks[max(0, i - backward) : i]))
            if behind:
                block.set_modules_to_backward_prefetch(behind)


def fsdp_kwargs(options, *, precision: str, device_type: str) -> dict:
    """`apply_fsdp` keywords from a `StrategyOptions`: the one FSDP2 configuration of every
    layout (reshard, prefetch, the mixed-precision policy of the run's precision, offload)."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy

    dtypes = mixed_dtypes(
        param_dtype=options.precision.param_dtype,
        reduce_dtype=options.precision.reduce_dtype,
        precision=precision,
        device_type=device_type,
    )
    # Pinned host memory needs CUDA; on a CPU-only machine plain memory does the same job.
    offload = (
        CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
        if options.sharding.cpu_offload
        else None
    )
    return {
        "reshard_after_forward": options.fsdp.reshard_after_forward,
        "mp_policy": mixed_precision_policy(dtypes),
        "offload_policy": offload,
        "prefetch_forward": options.fsdp.prefetch_forward,
        "prefetch_backward": options.fsdp.prefetch_backward,
    }
