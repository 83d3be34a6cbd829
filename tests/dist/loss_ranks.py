"""Rank worker of tests/dist/test_chunked_loss_dist.py; run it with `torchrun --nproc-per-node 2`.

Every rank trains the same small Llama for 10 AdamW steps on the same batches, with the plain
loss and with the chunked loss, on one process (its own copy), under tp=2 (sequence and loss
parallelism) and under pp=2 (1F1B, the loss on the last stage). Rank 0 writes a JSON of the
losses of every run and the embedding's gradient bytes, single and per TP rank, to argv[1].
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from lightning_dist.layout import Layout
from lightning_dist.lm.chunked_loss import chunked_cross_entropy, defer_output_head
from lightning_dist.measure.step_memory import storage_bytes
from lightning_dist.models.args import ModelArgs
from lightning_dist.parallel.parallelize import parallelize
from lightning_dist.parallel.tp import apply_tp

ARGS = ModelArgs(
    dim=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    vocab_size=1024,
    ffn_hidden_size=128,
    max_seq_len=64,
)
STEPS, BATCH, SEQ, CHUNK = 10, 4, 32, 48


def batches() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [
        torch.randint(0, ARGS.vocab_size, (BATCH, SEQ + 1), generator=gen) for _ in range(STEPS)
    ]


def build(chunked: bool):
    torch.manual_seed(0)
    model = ARGS.build()
    head = defer_output_head(model) if chunked else None
    return model, head


def loss_fn(head):
    """The plain loss, or the chunked one when the model's head defers its logits; a plain
    tensor either way (under loss parallelism the cross-entropy is a DTensor)."""

    def fn(output, targets):
        if head is None:
            loss = F.cross_entropy(output.flatten(0, 1).float(), targets.flatten())
        else:
            loss = chunked_cross_entropy(output, head.weight, targets, CHUNK)
        return loss.full_tensor() if isinstance(loss, DTensor) else loss

    return fn


def train(model, head, context=nullcontext, pipelined=False) -> tuple[list[float], int]:
    """Losses of STEPS steps, and the embedding's gradient bytes after the first backward."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    fn, losses, emb_grad = loss_fn(head), [], 0
    for step, batch in enumerate(batches()):
        x, y = batch[:, :-1], batch[:, 1:]
        opt.zero_grad()
        with context():
            if pipelined:
                loss = model(x, y, fn)  # forward and backward in the schedule
            else:
                loss = fn(model(x), y)
                loss.backward()
        if step == 0 and not pipelined:
            emb_grad = storage_bytes([model.tok_embeddings.weight.grad])
        opt.step()
        losses.append(float(loss.detach()))
    return losses, emb_grad


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result = {}
    for chunked in (False, True):
        name = "chunked" if chunked else "plain"
        model, head = build(chunked)
        result[f"single {name}"], result[f"single {name} emb grad"] = train(model, head)

        model, head = build(chunked)
        tp = Layout(tp=2)
        apply_tp(model, tp.build_mesh("cpu")["tp"], sequence_parallel=True, loss_parallel=True)
        result[f"tp2 {name}"], result[f"tp2 {name} emb grad"] = train(model, head, loss_parallel)

        model, head = build(chunked)
        pp = Layout(pp=2, microbatches=2)
        piped = parallelize(model, pp.build_mesh("cpu"), pp, device=torch.device("cpu"))
        heads = [m for m in piped.modules() if getattr(m, "defers_logits", False)]
        result[f"pp2 {name}"], _ = train(piped, heads[0] if heads else None, pipelined=True)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    from lightning_dist.runtime.process_end import run_then_end

    run_then_end(main, sys.argv[1])
