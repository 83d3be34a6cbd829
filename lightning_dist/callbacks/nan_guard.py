"""NonFiniteGuard: no optimizer step on a NaN or Inf loss or gradient.

Before every optimizer step each rank checks the step's loss and its gradients; the ranks agree
with one all-reduce (`StepFlags`, shared with Preemption's flag), so all of them take the same
decision. The default policy stops the run
with one line naming the step and the quantity (no step is taken, so no NaN reaches the weights
or a checkpoint); `policy="skip"` drops the step's gradients instead (the optimizer then updates
nothing) and stops after `max_skips` consecutive skips.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from lightning_dist.callbacks.context import step_flags

POLICIES = ("stop", "skip")


class NonFiniteError(RuntimeError):
    """The run stopped on a non-finite loss or gradient; the message is one line. Every rank
    raises it at the same step; `rank` says which one this is (train.py prints rank 0's)."""

    def __init__(self, message: str, rank: int = 0) -> None:
        super().__init__(message)
        self.rank = rank


class NonFiniteGuard(Callback):
    """Checks loss and gradients before each optimizer step (see the module docstring)."""

    def __init__(self, policy: str = "stop", max_skips: int = 5) -> None:
        if policy not in POLICIES:
            raise ValueError(f"trainer.nan_policy={policy!r} is not one of {', '.join(POLICIES)}")
        if not isinstance(max_skips, int) or max_skips < 1:
            raise ValueError(f"trainer.nan_max_skips={max_skips!r} must be a positive integer")
        self.policy, self.max_skips = policy, max_skips
        self.skipped_steps: list[int] = []
        """The optimizer steps (1-based) whose update was skipped."""
        self._loss_finite = True
        self._consecutive = 0

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        # Every micro-batch of the step: one non-finite loss spoils the accumulated gradients.
        self._loss_finite = self._loss_finite and _finite(loss)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        grads_finite = _all_finite([p.grad for p in params if p.grad is not None])
        # One all-reduce, shared with the flags other callbacks agree on each step (Preemption).
        bad = step_flags(trainer).agree(trainer, [not self._loss_finite, not grads_finite])
        self._loss_finite = True
        step = trainer.global_step + 1
        if not any(bad):
            self._consecutive = 0
            return
        what = "loss" if bad[0] else "gradient"
        if self.policy == "stop":
            raise NonFiniteError(
                f"the {what} is not finite at step {step}; stopped before the optimizer step, so "
                "no checkpoint holds it (lower optim.lr, or set trainer.nan_policy=skip)",
                trainer.global_rank,
            )
        self._consecutive += 1
        self.skipped_steps.append(step)
        if self._consecutive > self.max_skips:
            raise NonFiniteError(
                f"the {what} was not finite for {self._consecutive} steps in a row (last: step "
                f"{step}), more than trainer.nan_max_skips={self.max_skips}; lower optim.lr",
                trainer.global_rank,
            )
        for param in params:  # an optimizer skips parameters without a gradient
            param.grad = None

    def summary(self, world_size: int) -> dict[str, Any]:
        return {"skipped_steps": self.skipped_steps}


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element of every tensor is finite, with one host sync in the common case
    and no copy of a tensor. Each tensor is summed in its own dtype first: an inf or a NaN
    carries through to the sum (inf - inf is NaN), so finite sums prove every element finite.
    A non-finite sum can also be finite values that overflowed; only then is each tensor summed
    again in float64, where a sum of finite fp32 or bf16 values cannot overflow (fp32's largest
    value times 2^32 elements is still finite), so that sum is finite exactly when every element
    is. On CPU the first pass takes 0.8 ms for the tiny model's 3.3M gradients, the float64 one
    1.8 ms, the max-abs (infinity) norm, whose kernel is not vectorised, 9 ms."""
    from torch.distributed.tensor import DTensor

    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    local = [t.detach() for t in local if t.numel()]
    if not local:
        return True
    if bool(torch.isfinite(torch.stack([t.sum().float() for t in local])).all()):
        return True
    sums = torch.stack([t.sum(dtype=torch.float64) for t in local])
    return bool(torch.isfinite(sums).all())


def _finite(tensor: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    return bool(torch.isfinite(tensor.detach()).all())
