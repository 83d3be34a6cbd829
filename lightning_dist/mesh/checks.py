"""Can a layout split this model, with these options? One `ValueError` line naming the numbers.

The strategies run these before any process starts (from the meta model) and again in
`parallelize_model`; a plain loop calls `MeshRuntime.check_model`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lightning_dist.layout import Layout
from lightning_dist.models.protocol import require_init_weights
from lightning_dist.options import StrategyOptions
from lightning_dist.options.knobs import check_reshard
from lightning_dist.options.optimizer_sharding import shard_optimizer_problem
from lightning_dist.parallel.context_parallel import check_context_parallel
from lightning_dist.parallel.expert_parallel import check_expert_parallel
from lightning_dist.parallel.fsdp import find_block_types
from lightning_dist.parallel.pipeline import split_blocks
from lightning_dist.parallel.tp import check_tp
from lightning_dist.planner.layout_checks import float8_problem


def check_layout(layout: Layout, options: StrategyOptions) -> None:
    """The options that depend on the resolved layout: an integer `reshard_after_forward`
    divides the shard group, float8 runs at this tp (the planner's own rule), and ZeRO-1 has
    replicas to shard over."""
    reshard = options.fsdp.reshard_after_forward
    if not isinstance(reshard, bool):
        check_reshard(reshard, layout.shard_size)
    problem = float8_problem(options.float8.float8, layout.tp) or shard_optimizer_problem(
        layout, options
    )
    if problem:
        raise ValueError(problem)


def check_model(model: nn.Module, layout: Layout, options: StrategyOptions) -> None:
    """Can `layout` split `model`? Head, FFN and vocabulary divisibility by tp, the TP plan's
    patterns, the pipeline-layers contract, the layer count and split points, the attention
    slot and heads context parallelism needs, and the block classes to shard."""
    require_init_weights(model)
    args = model_args(model)
    if args is not None:
        layout.check_model(args)
    tp, auto_wrap = options.tp, options.sharding.auto_wrap
    check_expert_parallel(model, layout.ep, layout.tp, layout.pp,
                          getattr(args, "num_experts", 0))  # fmt: skip
    if layout.tp > 1:
        check_tp(model, layout.tp, plan=tp.tp_plan, sequence_parallel=tp.sequence_parallel,
                 shard_size=layout.shard_size)  # fmt: skip
    if layout.pp > 1:
        split_blocks(model, layout.num_stages, options.pipeline.split_points)
    if layout.cp > 1:
        heads = (None, None) if args is None else (args.n_heads, args.kv_heads)
        check_context_parallel(model, layout.cp, options.cp.cp_mode, n_heads=heads[0],
                               n_kv_heads=heads[1], tp=layout.tp)  # fmt: skip
    if auto_wrap is not None:
        find_block_types(model, auto_wrap)  # ValueError listing the model's blocks


def model_args(model: nn.Module) -> Any:
    """The ModelArgs of our Transformer or of a Llama-family HF model, else None."""
    args = getattr(model, "args", None)
    if args is not None:
        return args
    spec = getattr(model, "spec", None)
    try:
        return spec.to_model_args() if spec is not None else None
    except ValueError:  # an HF architecture ModelArgs cannot describe; the plan checks remain
        return None
