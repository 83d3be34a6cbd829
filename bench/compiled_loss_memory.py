"""What the cross-entropy holds a logit when torch.compile compiles it, against the planner.

    python bench/compiled_loss_memory.py

`lm/module.py`'s loss, `F.cross_entropy(logits.float(), targets)`, on bf16 logits of 2 x 256
tokens x 4096 vocabulary, eager and under torch.compile (inductor, CPU: about 20 s cold on 2
cores). It reports the bytes a logit that autograd saves for backward (a saved-tensors hook
sees what the compiled function saves too) and that the gradient of the logits takes; the
compiled loss's peak is their sum, as its backward is one kernel that reads the saved logits and
writes their gradient. Exits 1 if that sum is more than 2% off the planner's
`loss_bytes_per_logit(tp=1, compiled=True)`, or the compiled loss saves any fp32 tensor of the
logits' size.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lightning_dist.planner.activations import loss_bytes_per_logit  # noqa: E402

TOKENS, VOCAB = 2 * 256, 4096


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The loss as `lm/module.py` computes it."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def saved_and_gradient(loss_fn) -> tuple[list[tuple[torch.dtype, int]], float]:
    """(dtype and bytes of every tensor saved for backward, the gradient's bytes a logit)."""
    logits = torch.randn(2, TOKENS // 2, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, VOCAB, (2, TOKENS // 2))
    saved: list[tuple[torch.dtype, int]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append((t.dtype, t.numel() * t.element_size()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(logits, targets)
    loss.backward()
    assert logits.grad is not None
    grad = logits.grad.numel() * logits.grad.element_size() / (TOKENS * VOCAB)
    return saved, grad


def main() -> int:
    torch.manual_seed(0)
    logits = TOKENS * VOCAB
    failed = False
    for name, fn in (("eager", cross_entropy), ("compiled", torch.compile(cross_entropy))):
        saved, grad = saved_and_gradient(fn)
        kept = sum(n for _, n in saved) / logits
        print(f"{name:9s} saved {kept:5.2f} B/logit, gradient {grad:4.2f} B/logit")
        if name == "compiled":
            big_fp32 = [n for dtype, n in saved if dtype == torch.float32 and n >= logits]
            planner = loss_bytes_per_logit(tp=1, compiled=True, w=2)
            print(f"compiled peak {kept + grad:5.2f} B/logit, planner {planner:5.2f}")
            failed = abs(kept + grad - planner) > 0.02 * planner or bool(big_fp32)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
