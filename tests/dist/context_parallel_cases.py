"""Cases run on every rank of a world (tests/dist/world.py): context-parallel attention
against one device's attention, forward and backward."""

from __future__ import annotations


def attention_matches_one_device(
    mode: str, n_heads: int, n_kv_heads: int, dtype: str, packed: bool = False
) -> float:
    """The largest difference, relative to the largest value, between this rank's output and
    query/key/value gradients under `mode` and the same slices of one device's causal
    attention over the whole sequence (every rank computes that reference itself); `packed`:
    both under the mask of random documents of 1 to 8 tokens."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from world import init_group

    from lightning_dist.models.documents import document_causal_mask
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
    documents, mask = None, None
    if packed:  # a document starts where a draw of 1 in 4 says so
        starts = torch.rand(batch, seq, generator=generator) < 0.25
        documents = starts.long().cumsum(1)
        causal = torch.ones(seq, seq, dtype=torch.bool).tril()
        mask = document_causal_mask(documents, documents, causal)
    out = F.scaled_dot_product_attention(
        *full, attn_mask=mask, is_causal=mask is None, enable_gqa=n_heads != n_kv_heads
    )
    (out * grad_out).sum().backward()

    positions = chunk_positions(seq, cp, rank)
    mine = [t.index_select(2, positions).clone().requires_grad_() for t in (q, k, v)]
    attend = allgather_attention if mode == "allgather" else ulysses_attention
    by_document = {} if documents is None else {"documents": documents[:, positions]}
    local = attend(*mine, **by_document)
    (local * grad_out.index_select(2, positions)).sum().backward()

    pairs = [(local, out)] + [(m.grad, f.grad) for m, f in zip(mine, full, strict=True)]
    worst = 0.0
    for got, want in pairs:
        want = want.index_select(2, positions)
        worst = max(worst, float((got - want).abs().max() / want.abs().max()))
    return worst


def model_matches_one_device(mode: str, dtype: str) -> dict:
    """Our Transformer (llama_debug's shape, 64 tokens) under context parallelism over every
    rank of the world: the loss (mean over ranks of their chunks' mean) and the gradients
    (summed over ranks, divided by their number) against one device's full sequence."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from world import init_group

    from lightning_dist.models.args import ModelArgs
    from lightning_dist.parallel.context_parallel import (
        attach_context_parallel,
        chunk_positions,
    )

    init_group()
    rank, cp = dist.get_rank(), dist.get_world_size()
    kind = getattr(torch, dtype)
    args = ModelArgs(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=128,
        ffn_hidden_size=128,
        max_seq_len=64,
    )
    torch.manual_seed(0)
    full = args.build().to(kind)
    torch.manual_seed(0)
    mine = args.build().to(kind)
    attach_context_parallel(mine, mode)
    tokens = torch.randint(0, 128, (2, 65), generator=torch.Generator().manual_seed(1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def loss_of(model, x, y, positions=None):
        logits = model(x, positions) if positions is not None else model(x)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    reference = loss_of(full, inputs, targets)
    reference.backward()
    positions = chunk_positions(64, cp, rank)
    local = loss_of(mine, inputs[:, positions], targets[:, positions], positions)
    local.backward()
    loss = local.detach().clone()
    dist.all_reduce(loss)
    loss /= cp
    worst = 0.0
    for p, q in zip(full.parameters(), mine.parameters(), strict=True):
        grad = q.grad.clone()
        dist.all_reduce(grad)
        grad /= cp
        worst = max(worst, float((grad - p.grad).abs().max() / p.grad.abs().max()))
    return {"loss": abs(float(loss) - float(reference)) / abs(float(reference)), "grads": worst}
