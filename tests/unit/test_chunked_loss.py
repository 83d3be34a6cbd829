"""The chunked loss (lightning_dist.lm.chunked_loss) in one process: the same loss and gradients
as the plain cross-entropy (the deferred head keeps its name), a step peak lower by at least the
logits, and a model without an output head keeps the plain loss. (The 10-step losses under tp=2
and pp=2 are tests/dist/test_chunked_loss_dist.py.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightning_dist.lm.chunked_loss import chunked_cross_entropy, defer_output_head
from lightning_dist.measure.step_memory import measure_step
from lightning_dist.models.args import ModelArgs

ARGS = ModelArgs(
    dim=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    vocab_size=4096,
    ffn_hidden_size=128,
    max_seq_len=128,
)
TOKENS = torch.randint(0, ARGS.vocab_size, (4, 129), generator=torch.Generator().manual_seed(0))


def _model(chunked: bool):
    torch.manual_seed(0)
    model = ARGS.build()
    return model, defer_output_head(model) if chunked else None


def _loss(model, head, chunk: int = 100) -> torch.Tensor:
    x, y = TOKENS[:, :-1], TOKENS[:, 1:]
    if head is None:
        return F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
    return chunked_cross_entropy(model(x), head.weight, y, chunk)


def test_same_loss_and_gradients_as_the_plain_loss():
    (plain, _), (chunked, head) = _model(False), _model(True)
    a, b = _loss(plain, None), _loss(chunked, head)
    a.backward()
    b.backward()
    assert abs(a.item() - b.item()) <= 1e-6 * a.item()
    for (name, p), q in zip(plain.named_parameters(), chunked.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7, msg=name)
    # The head keeps its name, so checkpoints and TP plans see the same model.
    assert type(chunked.output).__name__ == "DeferredOutputHead"
    assert chunked.state_dict().keys() == plain.state_dict().keys()


def test_step_peak_drops_by_at_least_the_logits():
    peaks = {}
    for chunked in (False, True):
        model, head = _model(chunked)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)

        def step(model=model, head=head, opt=opt):
            opt.zero_grad()
            _loss(model, head, chunk=128).backward()
            opt.step()

        step()
        peaks[chunked] = measure_step(step, model, [opt])["total"]
    logits = TOKENS[:, 1:].numel() * ARGS.vocab_size * 4
    print(
        f"step peak: plain {peaks[False] / 2**20:.2f} MiB, chunked (128 tokens) "
        f"{peaks[True] / 2**20:.2f} MiB, drop {(peaks[False] - peaks[True]) / 2**20:.2f} MiB; "
        f"fp32 logits {logits / 2**20:.2f} MiB"
    )
    assert peaks[False] - peaks[True] >= logits


def test_models_without_an_output_head_keep_the_plain_loss():
    assert defer_output_head(torch.nn.Sequential(torch.nn.Linear(2, 2))) is None
    with pytest.raises(ValueError, match="loss_chunk_tokens=-1 must be 0"):
        ModelArgs(loss_chunk_tokens=-1)
