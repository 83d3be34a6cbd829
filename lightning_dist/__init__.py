"""lightning_dist: train large transformer language models across many accelerators from the
PyTorch Lightning Trainer — tuned FSDP, 3D parallelism, a pre-flight planner and telemetry."""

from lightning_dist.runtime.strategy_names import register_when_lightning_loads

__version__ = "0.2.0"
"""The package's version (pyproject.toml reads it here; CHANGELOG.md says what each one brought)."""

# Lazy, so that `import lightning_dist` (the planner, config composition) does not load Lightning.
_EXPORTS = {
    "TunedFSDPStrategy": "lightning_dist.strategies.fsdp",
    "FSDP2Strategy": "lightning_dist.strategies.fsdp2",
    "Parallel3DStrategy": "lightning_dist.strategies.parallel3d",
}

register_when_lightning_loads()


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lightning_dist' has no attribute {name!r}")


__all__ = ["FSDP2Strategy", "Parallel3DStrategy", "TunedFSDPStrategy", "__version__"]
