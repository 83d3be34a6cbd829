"""Fused projections under tensor parallelism and FSDP2: the `"colwise_fused(n)"` style.

A fused projection is one `nn.Linear` computing n tensors side by side (q, k and v of a
`Linear(C, 3C)` split by `.chunk(3, -1)`; gate and up). Plain colwise would give tp rank 0 all
of q and half of k; each part must be split on its own.

How it is held: under tensor parallelism the weight [n * O, in] becomes a DTensor of shape
[n, O, in] (the bias [n, O]) split on dim 1, `Shard(1)`: every rank holds its rows of each part.
FSDP2 shards the same dimension (`fused_shard_placement`), so a rank holds its dp_shard slice of
its tp slice of each part, `(_StridedShard(1, tp), Shard(1))` over (dp_shard, tp): a placement
DTensor reads correctly (`full_tensor()` is the single-device tensor). FSDP2 cannot shard the
flat [n * O, in] weight: it cuts a rank's [q_r; k_r; v_r] rows into contiguous blocks, which
mix parts and which no placement describes. The layer's own forward runs on the parts flattened
back (`single_device_view`): a [n * O, in] weight strided over tp, `_StridedShard(0, n)`, with no
communication; its linear keeps that placement on the output's last dimension, and the module
returns the local [q_r, k_r, v_r] for the user's `.chunk(n, -1)`.

Checkpoints hold the single-device [n * O, in] tensor: `single_device_view` is a DTensor of
that shape over the same local memory, with the placements that describe it, which
`checkpoint/pieces.py` writes and reads run by run. No Lightning here.
"""

from __future__ import annotations

import math
import re
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import ColwiseParallel

from lightning_dist._compat import (
    ParallelStyleHook,
    colwise_input_fn,
    module_internals,
    strided_shard_class,
)

FUSED_STYLE = re.compile(r"colwise_fused\(\s*(-?\d+)\s*\)")
# Leaf-name fragments of fused projections (nanoGPT's c_attn, GPT-NeoX's query_key_value,
# gate_up_proj, Wqkv...) and the number of parts each usually holds (None: unknown).
FUSED_NAMES = {"qkv": 3, "c_attn": 3, "query_key_value": 3, "gate_up": 2, "fused": None}
FUSED_PARTS = "fused_parts"
"""The attribute `FusedColwiseParallel` sets on the Linear it splits: its number of parts, read
by FSDP (`fused_shard_placement`) and by the checkpoint (`fused_layers`)."""


def fused_parts(style: Any) -> int | None:
    """n of a `"colwise_fused(n)"` style, None for any other style (n is not checked here)."""
    match = FUSED_STYLE.fullmatch(style.strip()) if isinstance(style, str) else None
    return int(match.group(1)) if match else None


def check_fused(name: str, module: nn.Module, style: str, tp: int, shard_size: int = 1) -> None:
    """ValueError (one line) when `module` cannot be split as `style` over `tp` ranks and then
    sharded by FSDP over `shard_size` ranks (dp_shard x cp): it must be an nn.Linear whose
    output features split into n parts, each divisible by tp and its tp slice by shard_size
    (FSDP2 shards a dimension other than the first only evenly)."""
    parts = fused_parts(style)
    if parts is None:
        raise ValueError(f"{name}: {style!r} is not a 'colwise_fused(n)' style")
    if not isinstance(module, nn.Linear):
        raise ValueError(
            f"TP plan style {style!r} of {name} needs an nn.Linear, got {type(module).__name__}"
        )
    out = module.weight.shape[0]
    if out % parts or (out // parts) % tp:
        raise ValueError(
            f"{name} is {style!r} but its {out} output features do not split into {parts} "
            f"equal parts each divisible by tp={tp}"
        )
    _check_shardable(name, style, (out // parts) // tp, shard_size)


def _check_shardable(name: str, style: str, rows: int, shard_size: int) -> None:
    if shard_size > 1 and rows % shard_size:
        raise ValueError(
            f"{name} is {style!r}: each part holds {rows} rows per tp rank, which FSDP cannot "
            f"split evenly over its {shard_size} ranks (dp_shard x cp); choose a dp_shard that "
            f"divides {rows}, or put the other ranks in dp_replicate"
        )


class FusedColwiseParallel(ParallelStyleHook, ColwiseParallel):
    """A fused projection (one `nn.Linear` computing `parts` tensors side by side) split part
    by part over the TP ranks: its weight held as [parts, out / parts, in] and its bias as
    [parts, out / parts], both `Shard(1)`. The input is replicated as for ColwiseParallel; the
    output is the local [part_0 slice r, part_1 slice r, ...], so `.chunk(parts, -1)` on it
    gives this rank's slice of each part."""

    def __init__(self, parts: int) -> None:
        super().__init__()
        self.parts = parts

    def apply_to(self, module: nn.Module, device_mesh) -> nn.Module:
        if not isinstance(module, nn.Linear):
            raise ValueError(
                f"TP style 'colwise_fused({self.parts})' needs an nn.Linear, got "
                f"{type(module).__name__}"
            )
        setattr(module, FUSED_PARTS, self.parts)
        # The class's own forward (nn.Linear's, a float8 Linear's), on the flat views.
        module.forward = partial(_on_flat_views, module, partial(type(module).forward, module))  # type: ignore[method-assign]
        module.reset_parameters = partial(_reset_fused, module)  # type: ignore[method-assign]
        # torch types output_fn as returning None; it returns the module's output, as ours does.
        return distribute_module(
            module,
            device_mesh,
            self._partition_fused,
            colwise_input_fn(self),
            _local_output,  # type: ignore[arg-type]
        )

    def _partition_fused(self, name: str, module: nn.Module, device_mesh) -> None:
        for pname, param in module.named_parameters(recurse=False):
            by_part = param.detach().unflatten(0, (self.parts, -1))
            dist_param = nn.Parameter(
                distribute_tensor(by_part, device_mesh, [Shard(1)], src_data_rank=None),
                requires_grad=param.requires_grad,
            )
            module.register_parameter(pname, dist_param)


def _on_flat_views(module: nn.Linear, forward, *args: Any, **kwargs: Any) -> Any:
    """`forward(*args, **kwargs)` with the weight and bias held by parts replaced, for the call,
    by their flat [n * O / tp, in] views (q_r, k_r, v_r locally): a view, so the gradient
    reaches the parameters, and FSDP's gathered ones are put back as they were."""
    slots = module_internals(module).parameters
    held = {name: slots[name] for name in ("weight", "bias") if slots.get(name) is not None}
    slots.update({name: single_device_view(value) for name, value in held.items()})
    try:
        return forward(*args, **kwargs)
    finally:
        slots.update(held)


@torch.no_grad()
def _reset_fused(module: nn.Linear) -> None:
    # nn.Linear's initialisation, uniform within 1 / sqrt(in_features) for the weight and the
    # bias: torch's would take the fan-in of the [n, O, in] shape the parts are held in (O * in).
    bound = 1 / math.sqrt(module.in_features)
    module.weight.uniform_(-bound, bound)
    if module.bias is not None:
        module.bias.uniform_(-bound, bound)


def _local_output(module: nn.Module, outputs: DTensor, device_mesh) -> torch.Tensor:
    # A strided shard of the last dimension: each rank's slice of every part, side by side.
    return outputs.to_local()


def fused_layers(model: nn.Module) -> dict[str, int]:
    """{module name: parts} of the layers split by `FusedColwiseParallel` in `model`."""
    return {
        name: getattr(module, FUSED_PARTS)
        for name, module in model.named_modules()
        if isinstance(getattr(module, FUSED_PARTS, None), int)
    }


def fused_shard_placement(model: nn.Module, shard_size: int):
    """FSDP2's `shard_placement_fn` for `model`: the parts' dimension (1) of each fused
    layer's weight and bias, the default (None: dim 0) for every other parameter; None when
    `model` has no fused layer. ValueError when a part's rows per tp rank do not divide by
    `shard_size`."""
    fused: set[int] = set()
    for name, _ in fused_layers(model).items():
        for pname, param in model.get_submodule(name).named_parameters(recurse=False):
            rows = param.to_local().shape[1] if isinstance(param, DTensor) else param.shape[1]
            _check_shardable(f"{name}.{pname}", "colwise_fused", rows, shard_size)
            fused.add(id(param))
    if not fused:
        return None
    return lambda param: Shard(1) if id(param) in fused else None


def single_device_view(tensor: torch.Tensor) -> torch.Tensor:
    """A fused tensor held by parts ([n, O, ...], see the module docstring) as the
    single-device [n * O, ...] tensor over the same memory: writing into the view's local
    tensor (under no_grad) writes into `tensor`'s, and a gradient through it reaches `tensor`.
    A DTensor's placements on dim 1 become strided placements of dim 0 (each part cut the same
    way), those on later dims move down by one. (DTensor's own flatten names the wrong rows
    under FSDP and gives a spec that a float8 Linear's bias add reads as replicated.)"""
    if not isinstance(tensor, DTensor):
        return tensor.view(-1, *tensor.shape[2:])
    parts = tensor.shape[0]
    placements = [_merged(p, parts) for p in tensor.placements]
    local = tensor.to_local()
    local = local.view(-1, *local.shape[2:])  # a view, never a copy: loads land in it
    shape = torch.Size([parts * tensor.shape[1], *tensor.shape[2:]])
    return DTensor.from_local(
        local,
        tensor.device_mesh,
        placements,
        run_check=False,
        shape=shape,
        stride=_contiguous_strides(shape),
    )


def _merged(placement, parts: int):
    """`placement` of [n, O, ...] as one of [n * O, ...]. DTensor applies mesh dimensions in
    order, each to what the earlier ones left; a split of dim 1 into s runs of each part's
    rows (Shard: s = 1) is a split of the merged dim into n * s runs."""
    strided: Any = strided_shard_class()
    if isinstance(placement, (Replicate, Partial)):
        return placement
    if isinstance(placement, strided) and placement.dim == 1:
        return strided(0, split_factor=parts * placement.split_factor)
    if isinstance(placement, strided) and placement.dim > 1:
        return strided(placement.dim - 1, split_factor=placement.split_factor)
    if isinstance(placement, Shard) and placement.dim == 1:
        return strided(0, split_factor=parts)
    if isinstance(placement, Shard) and placement.dim > 1:
        return Shard(placement.dim - 1)
    raise ValueError(f"a fused tensor held by parts is not split over its parts: {placement}")


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))
