"""Cases run on every rank of a world (tests/dist/world.py): context-parallel attention
against one device's attention, forward and backward."""

from __future__ import annotations


def attention_matches_one_device(mode: str, n_heads: int, n_kv_heads: int, dtype: str) -> float:
    """The largest difference, relative to the largest value, between this rank's output and
    query/key/value gradients under `mode` and the same slices of one device's causal
    attention over the whole sequence (every rank computes that reference itself)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from world import init_group

    from lightning_dist.parallel.context_parallel import (
        allgather_attention,
        chunk_positions,
        ulysses_attention,
    )

    init_group()
    rank, cp = dist.get_rank(), dist.get_world_size()
    kind = getattr(torch, dtype)
    generator = torch.Generator().manual_seed(0)
    batch, seq, dim = 2, 8 * cp, 16

    def draw(heads: int) -> torch.Tensor:
        return torch.randn(batch, heads, seq, dim, generator=generator, dtype=kind)

    q, k, v, grad_out = draw(n_heads), draw(n_kv_heads), draw(n_kv_heads), draw(n_heads)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*full, is_causal=True, enable_gqa=n_heads != n_kv_heads)
    (out * grad_out).sum().backward()

    positions = chunk_positions(seq, cp, rank)
    mine = [t.index_select(2, positions).clone().requires_grad_() for t in (q, k, v)]
    attend = allgather_attention if mode == "allgather" else ulysses_attention
    local = attend(*mine, positions)
    (local * grad_out.index_select(2, positions)).sum().backward()

    pairs = [(local, out)] + [(m.grad, f.grad) for m, f in zip(mine, full, strict=True)]
    worst = 0.0
    for got, want in pairs:
        want = want.index_select(2, positions)
        worst = max(worst, float((got - want).abs().max() / want.abs().max()))
    return worst
