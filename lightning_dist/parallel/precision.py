"""Mixed precision for the sharded strategies, resolved once for FSDP1, FSDP2 and 3D.

A strategy's `param_dtype`, `reduce_dtype` (and FSDP1's `buffer_dtype`) knobs are combined with
the Trainer's precision and the device type here; `apply_fsdp` (FSDP2) and the FSDP1 strategy
only turn the result into their own policy object.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}

# The compute dtype of each Lightning precision.
PRECISION_DTYPES = {
    "32-true": torch.float32,
    "32": torch.float32,
    "bf16-mixed": torch.bfloat16,
    "bf16-true": torch.bfloat16,
    "16-mixed": torch.float16,
    "16-true": torch.float16,
}


def parse_dtype(name: str | torch.dtype | None, field: str) -> torch.dtype | None:
    """`'bf16'` -> torch.bfloat16; None stays None. Raises ValueError naming `field`."""
    if name is None or isinstance(name, torch.dtype):
        return name
    if str(name).lower() not in DTYPES:
        raise ValueError(f"{field}={name!r} is not one of fp32, bf16, fp16 (or null)")
    return DTYPES[str(name).lower()]


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


@dataclass(frozen=True)
class MixedDtypes:
    """The dtypes FSDP gathers parameters in (compute), reduces gradients in and keeps
    buffers in."""

    compute: torch.dtype
    reduce: torch.dtype
    buffer: torch.dtype


def mixed_dtypes(
    *,
    param_dtype: str | None,
    reduce_dtype: str | None,
    precision: str,
    device_type: str,
    buffer_dtype: str | None = None,
) -> MixedDtypes | None:
    """Resolve the knobs against the run; None when everything stays fp32 (no policy needed).

    The compute dtype is `param_dtype` if set, else the precision's on GPUs. On CPUs the default
    stays fp32: bf16 matmuls there are slower and would break parity with a single device.
    Unset reduce and buffer dtypes follow the compute dtype.
    """
    compute = parse_dtype(param_dtype, "strategy.param_dtype")
    if compute is None:
        compute = precision_dtype(precision) if device_type != "cpu" else torch.float32
    reduce = parse_dtype(reduce_dtype, "strategy.reduce_dtype") or compute
    buffer = parse_dtype(buffer_dtype, "strategy.buffer_dtype") or compute
    if compute == reduce == buffer == torch.float32:
        return None
    return MixedDtypes(compute, reduce, buffer)
