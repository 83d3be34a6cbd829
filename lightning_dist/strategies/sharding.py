"""Checks and helpers shared by the FSDP1 (`fsdp_tuned`) and FSDP2 (`fsdp2`) strategies.

Each check raises ValueError naming the bad value and the fix. `train()` runs them before the
Trainer starts (one `error:` line on every rank); plain Lightning users hit the same checks in
the strategy's `setup_environment`/`setup`, also on every rank before step 1.
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_dist.parallel.fsdp import find_block_types, parse_dtype

# The compute dtype of each Lightning precision.
PRECISION_DTYPES = {
    "32-true": torch.float32,
    "32": torch.float32,
    "bf16-mixed": torch.bfloat16,
    "bf16-true": torch.bfloat16,
    "16-mixed": torch.float16,
    "16-true": torch.float16,
}
STATE_DICT_TYPES = ("sharded", "full")


def precision_dtype(precision: str) -> torch.dtype:
    """torch dtype that a Lightning precision computes in ('bf16-mixed' -> bfloat16)."""
    if str(precision) not in PRECISION_DTYPES:
        raise ValueError(
            f"trainer.precision={precision!r} is not supported by FSDP; use one of "
            f"{', '.join(PRECISION_DTYPES)}"
        )
    return PRECISION_DTYPES[str(precision)]


def check_param_dtype(param_dtype: str | None, precision: str) -> None:
    """`param_dtype`, when set, must be fp32 or the dtype the Trainer's precision computes in."""
    wanted = parse_dtype(param_dtype, "strategy.param_dtype")
    compute = precision_dtype(precision)
    if wanted not in (None, torch.float32, compute):
        raise ValueError(
            f"strategy.param_dtype={param_dtype} disagrees with trainer.precision={precision}; "
            f"set trainer.precision to the {param_dtype} mixed precision, or leave "
            "strategy.param_dtype null to follow the precision"
        )


def compute_dtype(param_dtype: str | None, precision: str, device_type: str) -> torch.dtype:
    """The dtype FSDP gathers parameters in: `param_dtype` if set, else the precision's on GPUs.

    On CPUs the default stays fp32: bf16 matmuls there are slower and would break parity.
    """
    explicit = parse_dtype(param_dtype, "strategy.param_dtype")
    if explicit is not None:
        return explicit
    return precision_dtype(precision) if device_type != "cpu" else torch.float32


def check_state_dict_type(value: str) -> str:
    if value not in STATE_DICT_TYPES:
        raise ValueError(
            f"strategy.state_dict_type={value!r} is not one of {', '.join(STATE_DICT_TYPES)}"
        )
    return value


def check_auto_wrap(model: nn.Module, auto_wrap) -> tuple[type[nn.Module], ...]:
    """The block classes to wrap; raises ValueError listing the model's blocks if one is absent."""
    return find_block_types(model, auto_wrap)


def check_activation_checkpointing(every_n: int) -> int:
    if not isinstance(every_n, int) or every_n < 0:
        raise ValueError(
            f"strategy.activation_checkpointing={every_n!r} must be 0 (off) or n to checkpoint "
            "every n-th block (1: every block)"
        )
    return every_n


def move_metrics(module: nn.Module, device: torch.device) -> None:
    """Move torchmetrics states, which FSDP does not move (they are not parameters)."""
    from torchmetrics import Metric

    for metric in (m for m in module.modules() if isinstance(m, Metric)):
        metric.to(device)
