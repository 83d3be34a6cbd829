"""`strategy=single`: one process on one device, the reference for every parity check."""

from __future__ import annotations

import torch
from lightning.pytorch.strategies import SingleDeviceStrategy


def single_device_strategy(device: str | None = None) -> SingleDeviceStrategy:
    """One process on `device`; by default the first GPU if there is one, else the CPU."""
    if device is None:
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    return SingleDeviceStrategy(device=torch.device(device))
