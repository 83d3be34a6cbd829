"""Tensor parallelism: apply a model's Megatron-style plan with DTensor.

A plan is data kept next to each model (`Transformer.tp_plan`, `HFCausalLM.tp_plan`): module-name
patterns mapped to style names (see `lightning_dist.models.protocol`). This file turns the names
into torch `ParallelStyle`s for the chosen options:

- without sequence parallelism each block's forward does two all-reduces (after the row-parallel
  attention output and MLP down projection), the norms are replicated;
- with it the residual stream stays split along the sequence; each all-reduce becomes a
  reduce-scatter, and an all-gather feeds each column-parallel sub-block, which saves only the
  sequence shard for backward and gathers it again there (`parallel/sequence_parallel.py`);
- with loss parallelism the logits stay split along the vocabulary and the cross-entropy runs
  on the shards (`torch.distributed.tensor.parallel.loss_parallel`), so the full
  [batch, seq, vocab] logits never exist on one rank. An output head that defers its logits to
  the loss (`lightning_dist.lm.chunked_loss`) gets its weight split the same way, and its
  (replicated) input hidden states are handed to the loss as they are;
- the embedding is vocabulary-parallel: each rank looks up the tokens its rows hold, on local
  tensors, so the gradient of its weight is its [vocab / tp, dim] shard. (torch's DTensor has
  no row-sharded rule for the embedding's backward and would hold a full [vocab, dim] gradient
  on every rank.)
- a fused projection (`"colwise_fused(n)"`: one Linear computing q, k and v side by side) is
  split part by part, under FSDP sharding too (`parallel/fused.py`). Plain `"colwise"` there
  would give rank 0 all of q and half of k: wrong math, silently, so `check_tp` warns when a
  layer under plain colwise is named like a fused one.
"""

from __future__ import annotations

import logging
import re
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel import loss_parallel as vocab_split_loss

from lightning_dist._compat import (
    ParallelStyleHook,
    rowwise_embedding_partition_fn,
    rowwise_output_fn,
)
from lightning_dist.models.protocol import TP_STYLES
from lightning_dist.parallel.fused import (
    FUSED_NAMES,
    FusedColwiseParallel,
    check_fused,
    fused_parts,
)
from lightning_dist.parallel.sequence_parallel import GatherSequenceInput

log = logging.getLogger(__name__)

# Attributes that some attention modules keep as head counts; divided by tp after sharding so
# that modules that use them (instead of inferring heads from shapes) see their local heads.
HEAD_COUNT_ATTRS = ("n_heads", "n_kv_heads", "num_heads", "num_key_value_heads", "n_local_heads")
# The weight dimension each style splits (nn.Linear weights are [out, in]); "colwise_fused(n)"
# splits dimension 0 too, each of its n parts on its own.
SPLIT_DIM = {"embedding": 0, "colwise": 0, "output": 0, "rowwise": 1}


def _split_dim(style: Any) -> int | None:
    if fused_parts(style) is not None:
        return 0
    return SPLIT_DIM.get(style) if isinstance(style, str) else None


def _is_column_parallel(style: Any) -> bool:
    return style == "colwise" or fused_parts(style) is not None


def plan_for(model: nn.Module, plan: dict[str, Any] | None = None) -> dict[str, Any]:
    """The user's plan if given, else the one the model's class carries as `tp_plan`."""
    if plan is None:
        plan = getattr(model, "tp_plan", None)
    if plan is None:
        raise ValueError(
            f"{type(model).__name__} has no tp_plan; pass a plan {{module pattern: style}} "
            f"with styles from {', '.join(TP_STYLES)}"
        )
    return dict(plan)


def match_plan(model: nn.Module, plan: dict[str, Any], *, strict: bool = True) -> dict[str, Any]:
    """Expand each pattern (`*` = one name segment) to the module names it matches.

    With `strict`, a pattern that matches nothing raises ValueError naming it (a typo in a plan
    must not silently leave a layer unsharded). Pipeline stages use strict=False since they
    hold only some of the modules.
    """
    names = [name for name, _ in model.named_modules() if name]
    matched: dict[str, Any] = {}
    for pattern, style in plan.items():
        _check_style_name(pattern, style)
        regex = re.compile(re.escape(pattern).replace(r"\*", r"[^.]+"))
        hits = [name for name in names if regex.fullmatch(name)]
        if strict and not hits:
            raise ValueError(
                f"TP plan pattern {pattern!r} matches no module of {type(model).__name__}"
            )
        matched.update(dict.fromkeys(hits, style))
    return matched


def _check_style_name(pattern: str, style: Any) -> None:
    if not isinstance(style, str):
        return  # a torch ParallelStyle object
    parts = fused_parts(style)
    if parts is not None and parts < 2:
        raise ValueError(
            f"TP plan style {style!r} of {pattern!r}: a fused projection holds n >= 2 parts "
            "(colwise_fused(3) for q, k, v side by side; use colwise for one tensor)"
        )
    if parts is None and (style not in TP_STYLES or "(" in style):
        raise ValueError(
            f"TP plan style {style!r} of {pattern!r} is not one of {', '.join(TP_STYLES)}"
        )


def uses_sequence_parallel(
    model: nn.Module, choice: bool | str, plan: dict[str, Any] | None = None
) -> bool:
    """Whether TP runs with sequence parallelism: `choice` True or False as given; "auto"
    when the plan names the norms (the Llama plan does; a plan without them cannot split the
    residual stream)."""
    if choice != "auto":
        return bool(choice)
    named = [s for s in plan_for(model, plan).values() if isinstance(s, str)]
    return "norm" in named


def check_tp(
    model: nn.Module,
    tp: int,
    *,
    plan: dict[str, Any] | None = None,
    sequence_parallel: bool | str = False,
    shard_size: int = 1,
) -> dict[str, Any]:
    """Check a plan against a (meta) model without a mesh; return the matched plan.

    Raises ValueError when a pattern matches nothing, when a split dimension is not divisible
    by `tp` (for `"colwise_fused(n)"`: the output features into n parts, each divisible by
    `tp`, and each tp slice by FSDP's `shard_size`, dp_shard x cp), or when sequence
    parallelism is asked (True, not "auto") of a plan that has no `"norm"` entries. Warns (one
    log line) when a layer under plain `"colwise"` is named like a fused projection.
    """
    matched = match_plan(model, plan_for(model, plan))
    named = [s for s in matched.values() if isinstance(s, str)]
    if sequence_parallel is True and named and "norm" not in named:
        raise ValueError(
            f"the TP plan of {type(model).__name__} has no 'norm' entries, so it cannot run "
            "sequence parallelism; set sequence_parallel=false"
        )
    for name, style in matched.items():
        module = model.get_submodule(name)
        weight = getattr(module, "weight", None)
        dim = _split_dim(style)
        if fused_parts(style) is not None:
            check_fused(name, module, style, tp, shard_size)
        elif dim is not None and weight is not None and weight.shape[dim] % tp:
            raise ValueError(
                f"{name}.weight dimension {dim} has size {weight.shape[dim]}, "
                f"not divisible by tp={tp}"
            )
    _warn_unfused(matched)
    return matched


_warned: set[str] = set()


def _warn_unfused(matched: dict[str, Any]) -> None:
    """One log line (rank 0, once per process) naming the layers under plain "colwise" whose
    names suggest a fused projection, and the style to use if they are one."""
    suspects = []
    for name, style in matched.items():
        leaf = name.rpartition(".")[2].lower()
        hits = [parts for fragment, parts in FUSED_NAMES.items() if fragment in leaf]
        if style == "colwise" and hits:
            suspects.append((name, hits[0]))
    if not suspects:
        return
    name, parts = suspects[0]
    more = f" (and {len(suspects) - 1} more like it)" if len(suspects) > 1 else ""
    message = (
        f"TP plan: {name}{more} is 'colwise' but is named like a fused projection (several "
        f"tensors in one output, e.g. q, k, v); plain colwise splits the whole output, so each "
        f"rank would get whole parts instead of a slice of each: if it is fused, use "
        f"'colwise_fused({parts or 'n'})' (n = its number of parts)"
    )
    import torch.distributed as dist

    if message in _warned or (dist.is_initialized() and dist.get_rank() != 0):
        return
    _warned.add(message)
    log.warning(message)


def apply_tp(
    model: nn.Module,
    tp_mesh,
    *,
    plan: dict[str, Any] | None = None,
    sequence_parallel: bool = False,
    loss_parallel: bool = True,
    strict: bool = True,
) -> nn.Module:
    """Shard `model` over the 1-D `tp_mesh` following its plan (or `plan`); returns the model.

    Works on a meta model or on a materialised one: each rank keeps its slice of the full
    tensors it already holds (no scatter from rank 0), so a model initialised identically on
    every rank keeps exactly its single-device values. With `loss_parallel` the output logits
    are a DTensor split on the vocabulary; compute the loss under
    `torch.distributed.tensor.parallel.loss_parallel()`.
    """

    matched = match_plan(model, plan_for(model, plan), strict=strict)
    styles = {
        name: style
        if not isinstance(style, str)
        else _style(style, model.get_submodule(name), sequence_parallel, loss_parallel)
        for name, style in matched.items()
    }
    styles = {name: style for name, style in styles.items() if style is not None}
    parallelize_module(model, tp_mesh, styles, src_data_rank=None)
    _divide_head_counts(model, matched, tp_mesh.size())
    log.info(
        "Applied tensor parallelism (tp=%d, %d modules, sequence_parallel=%s, loss_parallel=%s)",
        tp_mesh.size(),
        len(styles),
        sequence_parallel,
        loss_parallel,
    )
    return model


def _style(name: str, module: nn.Module, sequence_parallel: bool, loss_parallel: bool):
    """The torch ParallelStyle of a plan's style name, or None when it does nothing here."""

    # Between blocks the activations are either replicated or split along the sequence (dim 1).
    between = Shard(1) if sequence_parallel else Replicate()
    if name == "embedding":
        return VocabParallelEmbedding(output_layouts=between)
    if name == "colwise":
        return ColwiseParallel()
    if fused_parts(name) is not None:
        return FusedColwiseParallel(fused_parts(name))
    if name == "rowwise":
        return RowwiseParallel(output_layouts=between)
    if name == "output" and getattr(module, "defers_logits", False):
        return ColwiseParallel(
            input_layouts=between, output_layouts=Replicate(), use_local_output=False
        )
    if name == "output":
        return ColwiseParallel(
            input_layouts=between,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    if not sequence_parallel:
        return None
    if name == "norm":
        return SequenceParallel()
    # "sp_input": gather the first input (the rest, rotary tables..., pass through as they are)
    # and keep only its sequence shard for backward.
    return GatherSequenceInput()


def _vocab_parallel_lookup(module: nn.Embedding, tokens: torch.Tensor) -> DTensor:
    if isinstance(tokens, DTensor):
        tokens = tokens.to_local()
    weight = module.weight  # a DTensor split by rows over the TP mesh
    rows = weight.to_local()  # whose backward hands back a Shard(0) gradient: the local rows
    first = weight.device_mesh.get_local_rank() * rows.shape[0]
    ids = tokens - first
    outside = (ids < 0) | (ids >= rows.shape[0])
    out = F.embedding(ids.masked_fill(outside, 0), rows)
    out = out.masked_fill(outside.unsqueeze(-1), 0.0)
    # Each token's row lives on one rank and the others contribute zeros: a partial sum.
    return DTensor.from_local(out, weight.device_mesh, [Partial()], run_check=False)


class VocabParallelEmbedding(ParallelStyleHook, RowwiseParallel):
    """Rows of an `nn.Embedding` split over the TP ranks, looked up on local tensors.

    The tokens stay plain (replicated) tensors; each rank masks those outside its rows, and the
    partial outputs are summed into `output_layouts` (a reduce-scatter along the sequence under
    sequence parallelism, else an all-reduce). The weight's gradient is the local rows only.
    """

    def apply_to(self, module: nn.Module, device_mesh) -> nn.Module:
        if not isinstance(module, nn.Embedding):
            raise ValueError(
                f"TP style 'embedding' needs an nn.Embedding, got {type(module).__name__}"
            )
        module.forward = partial(_vocab_parallel_lookup, module)
        return distribute_module(
            module,
            device_mesh,
            rowwise_embedding_partition_fn(self),
            None,
            rowwise_output_fn(self),
        )


def _divide_head_counts(model: nn.Module, matched: dict[str, Any], tp: int) -> None:
    # The parents of column-parallel projections are the attention modules (and MLPs, which
    # have no head counts); only integer head-count attributes are touched.
    parents = {
        name.rpartition(".")[0] for name, style in matched.items() if _is_column_parallel(style)
    }
    for name in parents:
        module = model.get_submodule(name)
        for attr in HEAD_COUNT_ATTRS:
            value = getattr(module, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value % tp == 0:
                setattr(module, attr, value // tp)


def loss_parallel_context(tp: int, loss_parallel: bool):
    """The context the loss and its backward run in: torch's `loss_parallel()` when the logits
    stay split along the vocabulary (tp > 1 and `loss_parallel`), else nothing."""
    import contextlib

    if tp > 1 and loss_parallel:
        return vocab_split_loss()
    return contextlib.nullcontext()


def plain_tensor(value: torch.Tensor) -> torch.Tensor:
    """A detached plain-tensor copy of `value` that can be reduced in place and logged.

    Under loss parallelism (tp > 1) the cross-entropy of vocabulary-split logits is a DTensor.
    Lightning's `reduce` all-reduces a tensor in place (and on gloo divides it in place for a
    mean), which fails on a DTensor (c10d has no sharding rule) and on the view that
    `DTensor.full_tensor()` returns (autograd forbids in-place changes to a custom Function's
    output): reduce this copy instead.

    A DTensor gives its full (replicated) value; this is a collective over its mesh when the
    DTensor is sharded or partial, so every rank of that mesh must call it. The caller's tensor,
    and the graph it belongs to, are left untouched.
    """
    with torch.no_grad():
        if isinstance(value, DTensor):
            value = value.full_tensor()
        return value.detach().clone()
