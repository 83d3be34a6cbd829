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


def materialize_with_reset(module: torch.nn.Module, device: torch.device) -> None:
    """Allocate a meta-device module on `device` and initialise each submodule that holds
    parameters or buffers of its own with its `reset_parameters()` (torch's convention, what a
    user's `configure_model()` that sharded on the meta device expects). Nothing to do for a
    module without meta tensors; ValueError naming the classes that have no such method."""
    if not any(t.is_meta for t in [*module.parameters(), *module.buffers()]):
        return
    module.to_empty(device=device)
    missing = set()
    for sub in module.modules():
        if not any(True for _ in [*sub.parameters(recurse=False), *sub.buffers(recurse=False)]):
            continue
        reset = getattr(sub, "reset_parameters", None)
        if callable(reset):
            reset()
        else:
            missing.add(type(sub).__name__)
    if missing:
        raise ValueError(
            f"cannot initialise {', '.join(sorted(missing))} after building on the meta device: "
            "give each a reset_parameters() method, or build the model in configure_model() and "
            "pass it to self.trainer.strategy.parallelize_model()"
        )
