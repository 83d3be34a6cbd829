"""Context parallelism: one sequence split over the ranks of a CP group, attention computed
exactly as on one device. Pure torch.distributed; no Lightning.

The sequence is cut into 2 x cp chunks and rank r holds chunks r and 2cp - 1 - r (head and
tail), so that under a causal mask every rank has the same attention work. Two algorithms:

- `allgather_attention`: keys and values are gathered from every rank of the group, queries
  stay local; the mask compares true positions. The backward sums the key and value gradients
  of every rank and keeps this rank's part.
- `ulysses_attention`: two all-to-alls move queries, keys and values from sequence shards to
  head shards (each rank then sees the whole sequence for heads/cp of the heads) and the output
  back. Needs the query heads divisible by cp; key/value heads are repeated up to cp when
  there are fewer than cp, and must otherwise divide by cp.

With packed documents each also takes the document id of each of this rank's tokens and
gathers the whole sequence's (a few integers per token, once per attention call), so a query
attends only to keys of its own document (`models/documents.py`).

Both run SDPA (`torch.nn.functional.scaled_dot_product_attention`), so the same code runs on
CPUs and on GPUs' fused kernels (an explicit mask for the all-gather, which rules out the flash
kernel there; never measured). torch's own `context_parallel` does not run on CPU (torch 2.13:
no sharding strategy for the CPU flash operator), hence these.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lightning_dist.layout import ulysses_heads_problem
from lightning_dist.models.documents import document_causal_mask
from lightning_dist.parallel.hf_context_parallel import (
    attach_hf_context_parallel,
    check_hf_context_parallel,
)


def chunk_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """The positions (in the whole sequence) of rank `rank`'s tokens: chunks `rank` and
    `2 cp - 1 - rank` of 2 cp equal chunks. ValueError when seq_len does not split so."""
    if seq_len % (2 * cp):
        raise ValueError(
            f"data.seq_len={seq_len} does not split into 2 x strategy.cp = {2 * cp} equal chunks"
        )
    chunk = seq_len // (2 * cp)
    head = torch.arange(rank * chunk, (rank + 1) * chunk)
    tail = torch.arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk)
    return torch.cat([head, tail])


def shard_sequence(x: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's tokens of `x` along `dim` (`chunk_positions`)."""
    return x.index_select(dim, chunk_positions(x.size(dim), cp, rank).to(x.device))


def _all_gather_along(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Every rank's `x` of the group concatenated along `dim`, in rank order (no autograd)."""
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=dim)


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 2 ([B, H, S_local, D] -> [B, H, cp x S_local, D], rank order);
    backward: the sum over ranks of the gradient, this rank's slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group, ctx.local = group, x.size(2)
        return _all_gather_along(x, 2, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)  # gloo has no reduce-scatter
        start = dist.get_rank(ctx.group) * ctx.local
        return grad.narrow(2, start, ctx.local).contiguous(), None


def _positions(local_len: int, group) -> tuple[torch.Tensor, torch.Tensor]:
    """(this rank's token positions, every rank's in rank order) for a sequence whose chunks
    are laid out by `chunk_positions`: derived here, not exchanged."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    seq_len = local_len * cp
    every = torch.cat([chunk_positions(seq_len, cp, r) for r in range(cp)])
    return every[rank * local_len : (rank + 1) * local_len], every


def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask=None, scale: float | None = None
) -> torch.Tensor:
    """SDPA, causal without `mask`, with grouped-query heads: on CPUs SDPA groups them itself;
    on CUDA only the flash kernel takes `enable_gqa` and it takes no mask, so under a mask k
    and v are repeated instead of falling back to the math path's scores (never run on a GPU)."""
    grouped = q.size(1) != k.size(1)
    if grouped and mask is not None and q.device.type != "cpu":
        repeats = q.size(1) // k.size(1)
        k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        grouped = False
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=grouped
    )


def _gather_documents(documents: torch.Tensor, group) -> torch.Tensor:
    """Every rank's document ids [B, S_local] of the group, in rank order: [B, cp x S_local]."""
    return _all_gather_along(documents, 1, group)


def allgather_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group=None,
    documents: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention of this rank's queries ([B, Hq, S_local, D], the tokens of its
    `chunk_positions`) over the whole sequence's keys and values, gathered from the group;
    with `documents` (this rank's tokens' document ids, [B, S_local]) only within each.
    `scale`: of the scores, SDPA's 1/sqrt(D) when None."""
    keys, values = _GatherSequence.apply(k, group), _GatherSequence.apply(v, group)
    positions, key_positions = (p.to(q.device) for p in _positions(q.size(2), group))
    mask = key_positions[None, :] <= positions[:, None]
    if documents is not None:
        mask = document_causal_mask(documents, _gather_documents(documents, group), mask)
    return _attention(q, keys, values, mask=mask, scale=scale)


class _AllToAll(torch.autograd.Function):
    """`all_to_all_single` over dim 0 (equal splits); backward: the same exchange reversed."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()  # a permuted view: the exchange reads and writes memory order
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def _seq_to_heads(x: torch.Tensor, cp: int, group) -> torch.Tensor:
    """[B, H, S_local, D] sequence shard -> [B, H / cp, cp x S_local, D] head shard (the
    sequence in rank order)."""
    b, h, s, d = x.shape
    x = x.reshape(b, cp, h // cp, s, d).permute(1, 0, 2, 3, 4)
    x = _AllToAll.apply(x, group)  # dim 0: the rank the sequence piece came from
    return x.permute(1, 2, 0, 3, 4).reshape(b, h // cp, cp * s, d)


def _heads_to_seq(x: torch.Tensor, cp: int, group) -> torch.Tensor:
    """The inverse of `_seq_to_heads`."""
    b, h, s, d = x.shape
    x = x.reshape(b, h, cp, s // cp, d).permute(2, 0, 1, 3, 4)
    x = _AllToAll.apply(x, group)  # dim 0: the rank the heads go back to
    return x.permute(1, 0, 2, 3, 4).reshape(b, cp * h, s // cp, d)


def check_ulysses_heads(n_heads: int, n_kv_heads: int, cp: int, tp: int = 1) -> None:
    """ValueError unless Ulysses can split these heads (those of one tensor-parallel rank of
    `tp`) over cp ranks: the rule of `layout.ulysses_heads_problem`, which the planner reads."""
    problem = ulysses_heads_problem(n_heads * tp, n_kv_heads * tp, cp, tp)
    if problem:
        raise ValueError(problem)


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group=None,
    documents: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention by head shards: the same result as `allgather_attention`."""
    cp = dist.get_world_size(group)
    check_ulysses_heads(q.size(1), k.size(1), cp)
    if k.size(1) < cp:  # fewer key/value heads than ranks: one (repeated) head per rank
        k = k.repeat_interleave(cp // k.size(1), dim=1)
        v = v.repeat_interleave(cp // v.size(1), dim=1)
    order = torch.argsort(_positions(q.size(2), group)[1]).to(q.device)  # rank -> true order
    q, k, v = (_seq_to_heads(t, cp, group).index_select(2, order) for t in (q, k, v))
    mask = None
    if documents is not None:  # the whole sequence's, in true order
        documents = _gather_documents(documents, group).index_select(1, order)
        causal = torch.ones(q.size(2), q.size(2), dtype=torch.bool, device=q.device).tril()
        mask = document_causal_mask(documents, documents, causal)
    out = _attention(q, k, v, mask=mask, scale=scale)
    return _heads_to_seq(out.index_select(2, torch.argsort(order)), cp, group)


class ContextParallelAttention:
    """An attention step for a model's `attend` slot: `mode`'s algorithm over `group` (the
    model is fed this rank's `chunk_positions` tokens, `shard` cuts them)."""

    def __init__(self, mode: str, group=None) -> None:
        algorithms = {"allgather": allgather_attention, "ulysses": ulysses_attention}
        if mode not in algorithms:
            raise ValueError(f"strategy.cp_mode={mode!r} is not one of allgather, ulysses")
        self.mode, self.attend, self.group = mode, algorithms[mode], group
        self.calls = 0
        """Attention calls this rank ran through it (summary.json shows that CP ran)."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        documents: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        self.calls += 1
        return self.attend(q, k, v, self.group, documents, scale)

    def positions(self, seq_len: int, device=None) -> torch.Tensor:
        """This rank's token positions in a sequence of `seq_len` (`chunk_positions`)."""
        cp, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        return chunk_positions(seq_len, cp, rank).to(device)

    def shard(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's tokens of `x` along `dim` (inputs and targets alike)."""
        return x.index_select(dim, self.positions(x.size(dim), x.device))


def context_parallel_of(model: torch.nn.Module) -> ContextParallelAttention | None:
    """The context-parallel step `attach_context_parallel` gave `model`, or None."""
    for module in model.modules():
        step = getattr(module, "attend", None)
        if isinstance(step, ContextParallelAttention):
            return step
    return None


def shard_sequences(
    step: ContextParallelAttention,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    extra: dict[str, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """This rank's chunks of every sequence: inputs and targets alike, and the keyword inputs
    (`positions`, `documents`) with them, or else the chunks' true positions as `positions`.
    Every rank has as many tokens, so the mean over ranks of their mean losses is one device's
    loss, and FSDP's average of the gradients over dp_shard x cp is one device's gradient."""
    chunks = step.positions(inputs.size(1), inputs.device)
    inputs, targets = inputs.index_select(1, chunks), targets.index_select(1, chunks)
    if extra:
        return inputs, targets, {key: value.index_select(1, chunks) for key, value in extra.items()}
    return inputs, targets, {"positions": chunks}


def check_context_parallel(
    model: torch.nn.Module,
    cp: int,
    mode: str,
    *,
    n_heads: int | None,
    n_kv_heads: int | None,
    tp: int = 1,
) -> None:
    """ValueError in one line unless `model` can run under context parallelism of degree `cp`
    in `mode`: its attention modules need an `attend` slot, or it holds Hugging Face models
    whose attention goes through transformers' registry (`check_hf_context_parallel`); Ulysses
    needs the model's `n_heads` and `n_kv_heads` (None: unknown, not checked), per
    tensor-parallel rank of `tp`, to split over cp."""
    slots = any(hasattr(type(m), "attend") for m in model.modules())
    if not slots and not check_hf_context_parallel(model, cp):
        raise ValueError(
            f"strategy.cp={cp} needs attention modules with an `attend` slot (lightning_dist's "
            f"Transformer) or a Hugging Face model; {type(model).__name__} is neither: use "
            "strategy.cp=1"
        )
    if mode == "ulysses" and n_heads is not None and n_kv_heads is not None:
        check_ulysses_heads(n_heads // tp, n_kv_heads // tp, cp, tp)


def attach_context_parallel(model: torch.nn.Module, mode: str, group=None) -> None:
    """Route every attention module of `model` (those with an `attend` slot, and the attention
    layers of the Hugging Face models in it: `attach_hf_context_parallel`) through `mode`
    ("allgather" or "ulysses") over `group`; the model is then called with this rank's tokens
    and their `positions` (`chunk_positions`). ValueError for another mode."""
    step = ContextParallelAttention(mode, group)
    for module in model.modules():
        if hasattr(type(module), "attend"):
            module.attend = step
    attach_hf_context_parallel(model, step)
