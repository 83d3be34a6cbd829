"""A test and benchmark tool: ranks slower than they are, and slow links between them.

Never for real training: it only makes a run slower. `strategy.simulate_slowdown`,
`strategy.simulate_flops` and `strategy.simulate_delay_ms` switch it on (docs/SLOW_LINKS.md).

Why sleeps: on a shared 2-core CPU machine, compute slowed by thread counts or busy loops varied
by +-25% from run to run and even ranked two splits the wrong way round, while a sleep per layer
proportional to its cost gave 1-2% spread. So a simulated rank runs at a *simulated* speed: each
paced module (every block, and every linear layer outside the blocks, i.e. the output
projection) takes `factor x 2 x parameters x tokens / flops` seconds in forward and twice that
in backward. A hook sleeps until that much time has passed since the module started, so real
compute counts towards it and, as long as the simulated device is slower than the real one, the
noise of the real compute does not show. The cost is the matmul FLOPs of the module's
parameters (attention's score products and the embedding lookup count nothing), the same
estimate for every rank, so only the ratios of the factors matter. Activation recomputation
pays the forward time again, as a real device would: a forward that starts inside backward (the
recomputation of a checkpointed block) sleeps its forward time and adds it to that module's
backward.

The link delay wraps DDP communication hooks (`delayed_hook`): each gradient bucket's all-reduce
starts `delay` later, and backward waits for it (no overlap of the delay with compute, the
pessimistic end of a real slow link). Plain torch, no Lightning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from torch import nn

from lightning_dist._compat import in_backward

log = logging.getLogger(__name__)


def paced_modules(model: nn.Module, block_types: tuple[type[nn.Module], ...]) -> list[nn.Module]:
    """The modules a simulated rank paces: each block, and each linear layer outside them."""
    blocks = [m for m in model.modules() if isinstance(m, block_types)]
    inside = {id(sub) for block in blocks for sub in block.modules()}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and id(m) not in inside]
    return blocks + linears


def _tokens(values) -> int:
    """Tokens in the first tensor of a hook's arguments (all dimensions but the last)."""
    for value in values:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.numel() // max(value.shape[-1], 1)
    return 0


def _sleep_until(deadline: float) -> None:
    left = deadline - time.perf_counter()
    if left > 0:
        time.sleep(left)


class _Pace:
    """The hooks of one paced module: forward takes `seconds_per_token x tokens`, backward twice."""

    def __init__(self, seconds_per_token: float) -> None:
        self.seconds_per_token = seconds_per_token
        self.forward_start = 0.0
        self.backward_start = 0.0
        self.recomputed = 0.0
        """Seconds of forwards run inside the current backward (recomputation), which the
        backward's pace adds to its own."""

    def before_forward(self, module, args) -> None:
        if in_backward():
            # A checkpointed block recomputed within its backward: torch stops the recomputed
            # forward once it has the saved tensors, before the forward hook, so pace it here.
            seconds = self.seconds_per_token * _tokens(args)
            time.sleep(seconds)
            self.recomputed += seconds
            return
        self.forward_start = time.perf_counter()

    def after_forward(self, module, args, output) -> None:
        if not in_backward():
            _sleep_until(self.forward_start + self.seconds_per_token * _tokens(args))

    def before_backward(self, module, grad_output) -> None:
        self.backward_start = time.perf_counter()

    def after_backward(self, module, grad_input, grad_output) -> None:
        seconds = 2 * self.seconds_per_token * _tokens(grad_output) + self.recomputed
        self.recomputed = 0.0
        _sleep_until(self.backward_start + seconds)


def apply_simulated_speed(
    model: nn.Module, block_types: tuple[type[nn.Module], ...], *, factor: float, flops: float
) -> int:
    """Pace `model` as a device of `flops / factor` FLOP/s (see the module doc); returns how
    many modules are paced. Apply after activation checkpointing and compilation (the hooks
    then run outside compiled code) and before DDP wraps the model."""
    paced = paced_modules(model, block_types)
    for module in paced:
        params = sum(p.numel() for p in module.parameters())
        pace = _Pace(factor * 2 * params / flops)
        module.register_forward_pre_hook(pace.before_forward)
        module.register_forward_hook(pace.after_forward)
        module.register_full_backward_pre_hook(pace.before_backward)
        module.register_full_backward_hook(pace.after_backward)
    log.info("Simulated slowdown %.3g at %.3g FLOP/s: %d modules paced", factor, flops, len(paced))
    return len(paced)


def delayed_hook(hook: Callable, delay_s: float) -> Callable:
    """A DDP communication hook that waits `delay_s` seconds, then runs `hook`."""

    def hook_after_delay(state, bucket):
        time.sleep(delay_s)
        return hook(state, bucket)

    return hook_after_delay
