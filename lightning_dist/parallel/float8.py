"""Float8 training (`strategy.float8=tensorwise|rowwise`): torchao's float8 linear layers.

Each `nn.Linear` of the model becomes torchao's `Float8Linear`, which casts its input, weight and
output gradient to float8 (one scale per tensor for `tensorwise`, per row for `rowwise`) for the
three matmuls of forward and backward, and keeps the weight and its gradient in the parameter
dtype. Three kinds stay in high precision, as torchtitan keeps them: the output projection
(whose logits feed the loss), a mixture of experts' router gate (its float32 logits choose the
experts) and any layer with a size that is not a multiple of 16 (the float8 matmul needs that).
The grouped experts are not linear layers and stay in the compute dtype. On a machine without CUDA, torchao's emulation computes the same casts and scales
with plain matmuls (`emulate=True`), so the numerics can be tested on CPUs.

Applied to the whole model before tensor parallelism, activation checkpointing, compilation and
FSDP. With `all_gather` (`strategy.float8_all_gather`, tensorwise), FSDP gathers the weights
already cast to float8, each shard scaled by the whole weight's largest value, so the gathered
weight is the one a single device would cast; where the collective backend has no float8 type
(gloo), `gather_float8_as_bytes` moves those buffers as their bytes. Under tp > 1 (tensorwise)
the float8 linears take torch's ordinary tensor-parallel styles: their weights become DTensors,
each cast's scale comes from the whole tensor (its largest value reduced over the ranks), and
the activations travel in bf16 (torchao's float8 TP styles, which gather float8 activations,
are not used: gloo cannot move them). No Lightning import here.
"""

from __future__ import annotations

import dataclasses
import logging
from contextlib import contextmanager

import torch
from torch import nn

from lightning_dist._compat import all_gather_single
from lightning_dist.parallel.compile import OUTPUT_PROJECTIONS

log = logging.getLogger(__name__)


def check_float8(recipe: str) -> None:
    """Before launch: ValueError in one line when `recipe` cannot run here (torchao missing;
    a GPU without float8 matmuls, below compute capability 8.9)."""
    if recipe == "none":
        return
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        raise ValueError(_needs_torchao(recipe))
    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9):
        major, minor = torch.cuda.get_device_capability()
        raise ValueError(
            f"strategy.float8={recipe} needs float8 matmuls (compute capability 8.9 or newer: "
            f"H100, L4, RTX 4090); this GPU has {major}.{minor}: set strategy.float8=none"
        )


def _needs_torchao(recipe: str) -> str:
    return (
        f"strategy.float8={recipe} needs torchao: pip install 'lightning_dist[fp8]' "
        "(torchao 0.18), or set strategy.float8=none"
    )


ROUTER_GATES = ("router.gate",)
"""A mixture of experts' router (`models/moe.py`): its float32 logits choose each token's
experts, and it reads its weight directly (`F.linear` in float32), not through the module."""


def kept_by_design(fqn: str) -> bool:
    """The output projection and a router gate stay out of float8 whatever their sizes."""
    return fqn.split(".")[-1] in OUTPUT_PROJECTIONS or fqn.endswith(ROUTER_GATES)


def keeps_high_precision(module: nn.Module, fqn: str) -> bool:
    """Whether a linear layer stays out of float8 (see the module doc)."""
    if kept_by_design(fqn):
        return True
    return module.in_features % 16 != 0 or module.out_features % 16 != 0


def check_float8_layers(model: nn.Module, recipe: str) -> str | None:
    """Before launch, on the model built on the meta device: ValueError in one line when
    `recipe` would convert none of its linear layers (every one kept for a size that is not a
    multiple of 16, or by design); the text of one warning when it leaves some out for their
    sizes; None when every layer not kept by design converts (or `recipe` is none)."""
    if recipe == "none":
        return None
    linears = [(fqn, m) for fqn, m in model.named_modules() if isinstance(m, nn.Linear)]
    candidates = [(fqn, m) for fqn, m in linears if not kept_by_design(fqn)]
    misfit = [(fqn, m) for fqn, m in candidates if keeps_high_precision(m, fqn)]
    if not misfit:
        return None
    fqn, first = misfit[0]
    example = f"{fqn} is {first.in_features} x {first.out_features}"
    if len(misfit) == len(candidates):
        raise ValueError(
            f"strategy.float8={recipe} converts no linear layer of {type(model).__name__}: a "
            f"float8 matmul needs both sizes of a layer to be multiples of 16, and each of its "
            f"{len(candidates)} candidate layers has one that is not (e.g. {example}); use "
            "model sizes that are multiples of 16, or strategy.float8=none"
        )
    return (
        f"strategy.float8={recipe} converts {len(candidates) - len(misfit)} of "
        f"{len(candidates)} candidate linear layers; {len(misfit)} stay in high precision "
        f"because a size is not a multiple of 16 (e.g. {example}); use model sizes that are "
        "multiples of 16 to convert them"
    )


@contextmanager
def _quiet_loggers(*names: str):
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def apply_float8(
    model: nn.Module, recipe: str, *, device_type: str, all_gather: bool = False
) -> nn.Module:
    """Convert `model`'s linear layers to torchao's float8 training with `recipe` (and, with
    `all_gather`, weights FSDP gathers in float8); returns the model (use it: a model that is
    itself a Linear is replaced, not changed in place)."""
    if recipe == "none":
        return model
    try:
        # torchao logs one warning per CUDA kernel library it cannot load (none can on a CPU
        # build) and torch one about an enum it registers: neither is anything to act on.
        with _quiet_loggers("torchao", "torch.utils._pytree"):
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:  # check_float8 said so before launch; this is a direct call
        raise ValueError(_needs_torchao(recipe)) from e
    config = Float8LinearConfig.from_recipe_name(recipe)
    if all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    if device_type != "cuda":  # no float8 matmul kernels: the same numerics, emulated
        config = dataclasses.replace(config, emulate=True)
    converted = []

    def include(module: nn.Module, fqn: str) -> bool:
        keep = isinstance(module, nn.Linear) and not keeps_high_precision(module, fqn)
        if keep:
            converted.append(fqn)
        return keep

    model = convert_to_float8_training(model, config=config, module_filter_fn=include)
    log.info(
        "Float8 (%s%s): %d linear layers",
        recipe,
        ", emulated" if config.emulate else "",
        len(converted),
    )
    return model


FLOAT8_DTYPES = (
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
)


def check_float8_all_gather(model: nn.Module, dp_shard: int) -> None:
    """ValueError in one line when a float8 layer's rows do not split evenly over `dp_shard`:
    torchao's float8 all-gather fails on FSDP's padded last shard (pytorch/ao#3982, a size
    mismatch in the gather)."""
    from torchao.float8.float8_linear import Float8Linear

    for fqn, module in model.named_modules():
        if not isinstance(module, Float8Linear):
            continue
        weight = module.weight
        rows = (weight.to_local() if hasattr(weight, "to_local") else weight).shape[0]
        if rows % dp_shard:
            raise ValueError(
                f"strategy.float8_all_gather=true needs each float8 layer's rows to split evenly "
                f"over dp_shard={dp_shard}, but {fqn} has {rows} (torchao's float8 all-gather "
                "fails on uneven shards, pytorch/ao#3982); set strategy.float8_all_gather=false, "
                f"or a dp_shard that divides {rows}"
            )


class Float8BytesAllGather:
    """FSDP2's all-gather (`FSDPModule.set_custom_all_gather`) for a backend without float8
    collectives: a float8 buffer is gathered as its bytes (uint8), which arrive unchanged;
    any other dtype is gathered as it is."""

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, async_op: bool = False
    ):
        if output_tensor.dtype in FLOAT8_DTYPES:
            output_tensor, input_tensor = (
                output_tensor.view(torch.uint8),
                input_tensor.view(torch.uint8),
            )
        return all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)


def gather_float8_as_bytes(model: nn.Module) -> None:
    """Give every FSDP module of `model` the bytes all-gather (for gloo)."""
    from torch.distributed.fsdp import FSDPModule

    comm = Float8BytesAllGather()
    for unit in model.modules():
        if isinstance(unit, FSDPModule):
            unit.set_custom_all_gather(comm)
