"""Regional compilation: `torch.compile` each transformer block on its own, in place.

Compiling block by block instead of the whole model keeps compile time to one block's graph
(the blocks share their code, so the later ones reuse the first one's compiled code), and lets
FSDP, pipeline stages and Lightning's hooks stay outside the compiled regions. It runs after
tensor parallelism and activation checkpointing (a checkpointed block is compiled together with
its checkpoint, so the compiler sees the recomputation) and before FSDP.

`nn.Module.compile()` compiles a module where it stands: parameter names are unchanged (no
`_orig_mod.` segment), so checkpoints do not depend on this setting. No Lightning import here.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence

from torch import nn

from lightning_dist._compat import async_collective_tensor_class, checkpoint_wrapped_module
from lightning_dist.parallel.fsdp import block_modules

log = logging.getLogger(__name__)

OUTPUT_PROJECTIONS = ("output", "lm_head")
"""Names of the output projection in our models and Hugging Face's."""

BACKENDS = ("inductor", "aot_eager", "eager")
"""inductor generates kernels (Triton on GPUs, C++ on CPUs: needs a C compiler); aot_eager
traces forward and backward without generating code (fast to compile, for tests); eager only
captures the graph."""


def check_compile(compile_blocks: bool, backend: str, name: str = "strategy") -> None:
    """Raise ValueError naming the bad value when the compile settings cannot run here."""
    if not isinstance(compile_blocks, bool):
        raise ValueError(f"{name}.compile={compile_blocks!r} must be true or false")
    if backend not in BACKENDS:
        raise ValueError(f"{name}.compile_backend={backend!r} is not one of {', '.join(BACKENDS)}")
    if compile_blocks and backend == "inductor" and not _has_compiler_for_inductor():
        raise ValueError(
            f"{name}.compile=true with compile_backend=inductor needs a C compiler on CPUs "
            f"(none found); install gcc or set {name}.compile_backend=aot_eager"
        )


def _has_compiler_for_inductor() -> bool:
    import torch

    return torch.cuda.is_available() or any(shutil.which(cc) for cc in ("gcc", "cc", "clang"))


def block_slots(model: nn.Module, block_types: Sequence[type[nn.Module]]) -> list[nn.Module]:
    """The module standing in each block's place: the block, or its checkpoint wrapper."""
    wrappers = {}
    for module in model.modules():
        inner = checkpoint_wrapped_module(module)
        if inner is not None:
            wrappers[id(inner)] = module
    return [wrappers.get(id(b), b) for b in block_modules(model, block_types)]


def apply_compile(
    model: nn.Module,
    block_types: Sequence[type[nn.Module]],
    *,
    backend: str = "inductor",
    fullgraph: bool = False,
    tensor_parallel: bool = False,
) -> nn.Module:
    """Compile every block of `model` (with its checkpoint wrapper, if any) in place.

    `fullgraph=False` lets FSDP's hooks, which torch.compile skips, break the graph instead of
    failing. `tensor_parallel`: the model's layers are already tensor-parallel, so the outputs of
    the eager modules around the blocks are settled before a block reads them
    (`settle_async_output`). Returns `model`.
    """
    slots = block_slots(model, block_types)
    if not slots:
        log.warning("Compilation found no blocks in %s", type(model).__name__)
        return model
    for slot in slots:
        slot.compile(backend=backend, fullgraph=fullgraph)
    if tensor_parallel:
        inside = {id(m) for slot in slots for m in slot.modules()}
        for name, module in model.named_modules():
            # Not the model itself, nor its output projection: their outputs (the logits) go to
            # the loss, never into a block, and copying them would cost the largest activation.
            feeds_loss = module is model or name.split(".")[-1] in OUTPUT_PROJECTIONS
            if id(module) not in inside and not feeds_loss:
                module.register_forward_hook(settle_async_output)
    log.info("Applied torch.compile (%s) to %d blocks", backend, len(slots))
    return model


def settle_async_output(module: nn.Module, args, output):
    """A forward hook: an output still in flight (a tensor-parallel layer returns its
    collective's result as an `AsyncCollectiveTensor`) becomes a plain tensor, by a copy, before
    a compiled block reads it. Handed in as it is, AOTAutograd traces the block with a plain
    tensor but DTensor's backward of the pending redistribute then receives a plain gradient
    ("'Tensor' object has no attribute '_local_tensor'", torch 2.13). The copy keeps the autograd
    edge to the collective; `.wait()` instead would cut the gradient of the layer before it."""
    if isinstance(output, async_collective_tensor_class()):
        return output.clone()
    return None
