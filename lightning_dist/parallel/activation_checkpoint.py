"""Activation checkpointing of blocks, whole or selective (op-level), as one function over a model.

Four choices, one setting (`strategy.activation_checkpointing`):

- `0` or `"none"`: off;
- `n` (an int) or `"full"` (= 1): every n-th block keeps only its input during forward and
  recomputes its activations in backward (activation memory of those blocks drops to about one
  tensor each, for roughly a third more compute);
- `"op"` (alias `"selective"`): every block is checkpointed, but the outputs of its matmuls,
  attention kernels and reducing collectives are saved; only the cheap ops between them (norms,
  activations, RoPE, residual adds, casts) are recomputed. Most of full checkpointing's memory
  saving on pointwise tensors, for a few percent of recompute instead of a third.

  Under tensor parallelism two kinds of output are as large as the unsplit activations and are
  recomputed instead, so that op-level keeps less than no checkpointing in every layout:
  the matmuls of row-parallel linears (weights split along their input; their outputs are
  partial sums over the whole sequence, which the saved reduce-scatter or all-reduce output
  replaces) and all-gathers (under sequence parallelism, the gathered norm output: the gather
  runs again in backward, as Megatron-LM's sequence parallelism does).
- `"op_alternate"`: op-level, but the block's matmuls are numbered in forward order and only the
  odd ones (1st, 3rd, ...) keep their outputs; the even ones run again in backward. For our
  Llama block (wq, wk, wv, wo, w1, w3, w2) that keeps wq, wv, w1 and w2 and recomputes wk, wo
  and w3: torchtitan's op policy, whose published runs the planner is calibrated on.

The setting itself is parsed in `lightning_dist/options/activation_checkpointing.py` (no torch there,
so the planner shares it). No Lightning import here.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import torch
from torch import nn

from lightning_dist._compat import (
    ATTENTION_KERNELS,
    checkpoint_wrapper_api,
    functional_collective_ops,
)
from lightning_dist.options.activation_checkpointing import (  # noqa: F401 (re-exported)
    CheckpointChoice,
    parse_activation_checkpointing,
)
from lightning_dist.parallel.fsdp import block_modules

log = logging.getLogger(__name__)


MATMULS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm")
"""`_scaled_mm` is the float8 matmul (strategy.float8 on a GPU; the CPU emulation uses mm)."""


def _ops(space, names) -> list:
    return [getattr(space, op).default for op in names if hasattr(space, op)]


def saved_ops() -> list:
    """The ops whose outputs op-level checkpointing keeps: matmuls, attention kernels and the
    reducing collectives (recomputing them would repeat their work or their communication).
    Row-parallel matmuls are the exception (`SelectivePolicy`)."""
    return [
        *_ops(torch.ops.aten, MATMULS),
        *_ops(torch.ops.aten, ATTENTION_KERNELS),
        *_ops(functional_collective_ops(), (
            "all_reduce", "reduce_scatter_tensor", "all_to_all_single",
        )),
    ]  # fmt: skip


def row_parallel(module: nn.Module) -> bool:
    """Is `module` a linear whose weight is a DTensor split along its input dimension (torch's
    RowwiseParallel)? Its matmul yields a partial sum that a collective then reduces."""
    from torch.distributed.tensor import DTensor, Shard

    weight = getattr(module, "weight", None)
    return (
        isinstance(module, nn.Linear)
        and isinstance(weight, DTensor)
        and any(isinstance(p, Shard) and p.dim == 1 for p in weight.placements)
    )


class SelectivePolicy:
    """The op-level policy of one model: save `saved_ops()`' outputs, except the matmuls that
    run inside a row-parallel linear (`watch` marks those modules with forward hooks; the
    policy is asked only during forward, and recomputation replays its answers in order)."""

    def __init__(self, alternate_matmuls: bool = False) -> None:
        self.saved = frozenset(saved_ops())
        self.matmuls = frozenset(_ops(torch.ops.aten, MATMULS))
        self.inside_row_parallel = 0
        self.alternate_matmuls = alternate_matmuls

    def watch(self, module: nn.Module) -> None:
        def enter(*_):
            self.inside_row_parallel += 1

        def leave(*_):
            self.inside_row_parallel -= 1

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave, always_call=True)

    def __call__(self, ctx, op, *args, **kwargs):
        from torch.utils.checkpoint import CheckpointPolicy

        keep = op in self.saved and not (self.inside_row_parallel > 0 and op in self.matmuls)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    def context_fn(self):
        """The `context_fn` of torch.utils.checkpoint: a plain function, as torch.compile
        requires of it. (A compiler traces the block with the hooks' effects deferred, so under
        TP the policy marks the row-parallel matmuls to be kept; the compiler's partitioner
        keeps only what backward reads, and backward never reads those partial sums, so they
        are not kept: tests/dist/test_world.py checks that no compiled block saves a
        full-sequence activation.)"""
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        def context():
            # A block's forward starts outside every linear: a count left over by a forward
            # that raised (or by a hook of another style that raised first) starts again here.
            self.inside_row_parallel = 0
            if not self.alternate_matmuls:
                return create_selective_checkpoint_contexts(self)
            # This block's matmuls numbered from 1 in its forward (the policy is asked only
            # there; recomputation replays its answers).
            counts = [0]

            def alternate(ctx, op, *args, **kwargs):
                if op in self.matmuls:
                    counts[0] += 1
                    if counts[0] % 2 == 0:
                        from torch.utils.checkpoint import CheckpointPolicy

                        return CheckpointPolicy.PREFER_RECOMPUTE
                return self(ctx, op, *args, **kwargs)

            return create_selective_checkpoint_contexts(alternate)

        return context


def apply_activation_checkpointing(
    model: nn.Module,
    block_types: Sequence[type[nn.Module]],
    *,
    every_n: int | str | CheckpointChoice = 1,
) -> nn.Module:
    """Wrap the chosen blocks of `model` in a non-reentrant checkpoint wrapper, in place.

    `every_n` is any `activation_checkpointing` setting: an int (0 off, n: blocks 0, n, 2n, ...
    in full) or a name ('none', 'full', 'op', 'selective'). Returns `model`.

    Call it before FSDP2's `apply_fsdp` (the torchtitan order) or after FSDP1 has wrapped the
    model (checkpointing then runs inside each FSDP unit); both keep parameter names but add a
    `_checkpoint_wrapped_module.` segment.
    """
    choice = parse_activation_checkpointing(every_n)
    if not choice.enabled:
        return model
    wrap_matching, checkpoint_wrapper = checkpoint_wrapper_api()
    blocks = block_modules(model, block_types)
    if not blocks:
        log.warning("Activation checkpointing found no blocks in %s", type(model).__name__)
        return model
    chosen = {id(b) for i, b in enumerate(blocks) if i % choice.every_n == 0}
    wrapper = checkpoint_wrapper
    if choice.mode == "op":
        policy = SelectivePolicy(choice.alternate_matmuls)
        for block in blocks:
            for module in filter(row_parallel, block.modules()):
                policy.watch(module)
        wrapper = functools.partial(checkpoint_wrapper, context_fn=policy.context_fn())
    wrap_matching(model, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: id(m) in chosen)
    log.info(
        "Applied %s activation checkpointing to %d of %d blocks",
        {"op": "op-level (selective)", "op_alternate": "op-level (every other matmul)"}.get(
            choice.label, "full"
        ),
        len(chosen),
        len(blocks),
    )
    return model
