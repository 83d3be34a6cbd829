"""Pipeline stages as the code cuts them, per rank: the blocks of each chunk and the parameters
one rank of the stage holds (`StageShape`), for the memory and time models (`planner/memory.py`,
`planner/timing.py`). Duck-typed over `ModelArgs` like the rest of the planner; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_dist.layout import Layout, balanced_split, run_lengths, stage_sizes
from lightning_dist.planner.experts import (
    expert_degree,
    is_moe,
    layer_params_on_rank,
    moe_layer_count,
)


@dataclass(frozen=True)
class StageShape:
    """Parameters held by one rank of one pipeline stage (already divided by tp)."""

    layers: int
    params: float
    block: float
    """Parameters of one block: one FSDP unit."""
    roots: tuple[float, ...]
    """The stage's parameters outside its blocks (the embedding; the final norm with the
    output): FSDP's root unit."""
    has_embedding: bool
    has_output: bool
    chunks: tuple[int, ...]
    """Blocks of each pipeline chunk this rank holds, in its stages' order (one chunk without
    interleaving); `layers` is their sum."""
    rank: int
    """The pipeline rank (0 without PP)."""
    block_linear: float = 0.0
    """Parameters of one block's linear layers (`block` less the norm scales): what float8
    converts, and what FSDP gathers in float8 under `strategy.float8_all_gather`."""
    experts: float = 0.0
    """Of `params`, the routed experts this rank holds (a mixture of experts: 1/ep of each MoE
    layer's, `planner/experts.py`), which FSDP shards over shard_size / ep ranks."""
    moe_layers: int = 0
    """Of `layers`, the MoE blocks."""


_SHAPES: dict = {}
"""`stage_shapes` by (model, the layout fields it reads, split points): a search asks for the
same stages at every micro-batch size, checkpointing choice and FSDP mode."""


def stage_shapes(
    model, layout: Layout, split_points: list[int] | None = None
) -> list[tuple[str, StageShape]]:
    """`cut_stages`, remembered (the shapes depend on the model, tp, ep, pp, the virtual
    stages and whether the schedule is a V; not on the batch or the data-parallel split)."""
    ep = expert_degree(layout)
    key = (
        repr(model),
        layout.pp,
        layout.tp,
        ep,
        layout.virtual_stages,
        layout.schedule == "ZBVZeroBubble",
        tuple(split_points or ()),
    )
    shapes = _SHAPES.get(key)
    if shapes is None:
        if len(_SHAPES) > 4096:
            _SHAPES.clear()
        shapes = _SHAPES[key] = cut_stages(model, layout, split_points)
    return list(shapes)


def cut_stages(
    model, layout: Layout, split_points: list[int] | None = None
) -> list[tuple[str, StageShape]]:
    """One entry per pipeline rank ('only' without PP; 'first', 'rank r' ..., 'last'), with
    the blocks of each of its chunks as the code cuts them: `layout.stage_sizes`, the balanced
    split of `parallel/pipeline.py` over the parameter counts (the embedding on the first
    stage, the final norm and output on the last, which therefore hold fewer blocks; Llama 3
    405B's 126 layers over 16 stages: 7, 8, ..., 8, 7), and the chunks of a rank as
    `Layout.stage_ids` assigns them (looped, or a V for ZBVZeroBubble, whose first rank holds
    the output too). `split_points` (`strategy.split_points`: the first block of every stage
    but the first) replaces the balanced cut. Under TP the projections and the vocab-parallel
    embedding/output divide by tp; the norm scales are replicated.
    """
    tp, d = layout.tp, model.dim
    vocab = model.vocab_size * d / tp
    ep = expert_degree(layout)
    per_layer = [layer_params_on_rank(model, i, tp, ep) for i in range(model.n_layers)]

    def shape(
        first: bool, last: bool, chunks: tuple[int, ...], rank: int, starts: tuple[int, ...]
    ) -> StageShape:
        roots = []
        if first:
            roots.append(vocab)
        if last:
            # A tied output shares the embedding's weight only when both live on this rank.
            roots.append((0.0 if (model.tie_embeddings and first) else vocab) + d)
        held = [
            per_layer[i]
            for start, n in zip(starts, chunks, strict=True)
            for i in range(start, start + n)
        ]
        params = sum(p for p, _, _ in held) + sum(roots)
        block = max((p for p, _, _ in held), default=per_layer[-1][0])
        linear = max((q for _, _, q in held), default=per_layer[-1][2])
        moe = sum(moe_layer_count(model, s, n) for s, n in zip(starts, chunks, strict=True))
        return StageShape(
            sum(chunks),
            params,
            block,
            tuple(roots),
            first,
            last,
            chunks,
            rank,
            linear,
            sum(e for _, e, _ in held),
            moe,
        )

    if layout.pp == 1:
        return [("only", shape(True, True, (model.n_layers,), 0, (0,)))]
    n = layout.num_stages
    embedding = model.vocab_size * d
    if split_points:
        sizes = run_lengths(split_points, model.n_layers)
    else:
        blocks = (
            tuple(model.layer_params(i) for i in range(model.n_layers))
            if is_moe(model)
            else model.block_params()
        )
        if n > model.n_layers:
            sizes = end_chunk_sizes(model.n_layers, n, blocks, embedding, embedding + d)
        else:
            sizes = stage_sizes(model.n_layers, n, blocks, embedding, embedding + d)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    out = []
    for rank in range(layout.pp):
        ids = layout.stage_ids(rank)
        name = "first" if rank == 0 else "last" if rank == layout.pp - 1 else f"rank {rank}"
        chunks = tuple(sizes[i] for i in ids)
        first_blocks = tuple(starts[i] for i in ids)
        out.append((name, shape(0 in ids, n - 1 in ids, chunks, rank, first_blocks)))
    return out


def end_chunk_sizes(
    n_blocks: int, num_stages: int, block: int | tuple[int, ...], first: int, last: int
) -> tuple[int, ...]:
    """Blocks per stage when there are more stages than blocks (at most two more,
    `layout_checks.EXTRA_CHUNKS`): the embedding (`first` parameters) and the output (`last`) are
    cut as units of their own, so the first or the last stage may hold no block at all
    (an embedding-only or a loss-only chunk); the balanced cut of `stage_sizes` otherwise."""
    blocks = list(block) if isinstance(block, tuple) else [block] * n_blocks
    runs = list(run_lengths(balanced_split([first, *blocks, last], num_stages), n_blocks + 2))
    runs[0] -= 1
    runs[-1] -= 1
    return tuple(runs)
