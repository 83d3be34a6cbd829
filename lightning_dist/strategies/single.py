"""`strategy=single`: one process on one device, the reference for every parity check."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_dist.layout import Layout
from lightning_dist.options import StrategyOptions
from lightning_dist.strategies.base import LightningDistStrategy, build_options


class SingleProcessStrategy(LightningDistStrategy, SingleDeviceStrategy):
    """Lightning's SingleDeviceStrategy, declaring the contract: one rank, whatever the devices."""

    single_process = True
    preset = "single"

    def __init__(self, *, options: StrategyOptions | None = None, **kwargs: Any) -> None:
        self.options, rest = build_options(type(self), self.preset, options, kwargs)
        super().__init__(**rest)
        self.check_machine_options()

    def declared_layout(self, num_nodes: int) -> Layout:
        return Layout()

    def layout_for(self, devices: int, num_nodes: int) -> Layout:
        return Layout()


def single_device_strategy(device: str | None = None, **knobs: Any) -> SingleProcessStrategy:
    """One process on `device`; by default the first GPU if there is one, else the CPU.
    `knobs`: those of `options.PRESETS["single"]` (`compile`, `compile_backend`, `float8`)."""
    if device is None:
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    return SingleProcessStrategy(device=torch.device(device), **knobs)
