"""Turn a model built on the meta device into real, initialised tensors."""

from __future__ import annotations

import torch

from lightning_dist.models.protocol import require_init_weights


def materialize(model: torch.nn.Module, device: torch.device, seed: int) -> torch.nn.Module:
    """Allocate a meta-device model on `device` and initialise it from `seed`.

    The seed is applied in a forked RNG so that every layout initialises the same weights,
    whatever else consumed random numbers before.
    """
    if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        require_init_weights(model)
        model.to_empty(device=device)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            model.init_weights()
    return model.to(device)
