"""How DDP's replicas exchange gradients: one communication hook per run (torch's DDP comm
hooks), chosen by `strategy.grad_compression` and `strategy.diloco_inner_steps`, optionally
behind the simulated link delay (`cluster/simulate.py`). Plain torch, no Lightning.

- `none`: torch's default all-reduce (fp32 gradients, averaged over the group);
- `bf16` / `fp16`: each bucket cast to half precision, averaged, cast back (torch's
  `bf16_compress_hook` / `fp16_compress_hook`, written out: DDP refuses torch's bf16 one off
  NCCL): half the bytes, a rounding error per step;
- `powersgd`: torch's PowerSGD (Vogels et al. 2019) with error feedback and warm start: each
  matrix gradient travels as two rank-r factors; vectors and matrices whose factors would not
  be at least 2x smaller (torch's `min_compression_rate`) travel whole, in a third all-reduce.
  The first `start_step` steps all-reduce uncompressed; its state (error feedback, step count)
  is not in checkpoints;
- `local` (DiLoCo's inner steps, `cluster/diloco.py`): no collective, each replica keeps its
  own gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from lightning_dist.cluster.simulate import delayed_hook


def half_precision_hook(dtype: torch.dtype) -> Callable:
    """A DDP hook that all-reduces each bucket in `dtype` (divided by the group size first,
    so the sum cannot overflow fp16) and writes the mean back in the gradients' dtype. The
    same as torch's `fp16_compress_hook` / `bf16_compress_hook`, which DDP refuses by name for
    bf16 unless it runs on NCCL; this one runs on any backend (gloo reduces bf16 too)."""

    def compress_hook(process_group, bucket):  # no annotation: DDP checks it as an object
        group = process_group if process_group is not None else dist.group.WORLD
        buffer = bucket.buffer()
        compressed = buffer.to(dtype).div_(dist.get_world_size(group))
        future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

        def decompress(done) -> torch.Tensor:
            buffer.copy_(done.value()[0])
            return buffer

        return future.then(decompress)

    return compress_hook


def gradient_hook(
    compression: str,
    *,
    local: bool = False,
    powersgd_rank: int = 2,
    powersgd_start_step: int = 10,
    delay_s: float = 0.0,
    process_group: Any = None,
) -> tuple[Any, Callable] | None:
    """(state, hook) to pass to `DistributedDataParallel.register_comm_hook`, or None when
    DDP's built-in all-reduce does the job (no compression, no delay, not local)."""
    from torch.distributed.algorithms.ddp_comm_hooks import (
        debugging_hooks,
        default_hooks,
        powerSGD_hook,
    )

    if local:  # nothing leaves the rank, so there is nothing to delay
        return None, debugging_hooks.noop_hook
    if compression == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=process_group,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=powersgd_start_step,
            use_error_feedback=True,
            warm_start=True,
        )
        hook = powerSGD_hook.powerSGD_hook
    elif compression in ("bf16", "fp16"):
        state = process_group
        hook = half_precision_hook(torch.bfloat16 if compression == "bf16" else torch.float16)
    elif compression == "none":
        if delay_s <= 0:
            return None
        state, hook = process_group, default_hooks.allreduce_hook
    else:
        raise ValueError(f"strategy.grad_compression={compression!r} is not known")
    return state, delayed_hook(hook, delay_s) if delay_s > 0 else hook
