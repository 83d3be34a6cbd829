"""Cases that run `lightning_dist.train.train` inside the ranks of a `World` (tests/dist/world.py)."""

from __future__ import annotations


def train_case(overrides: list[str], run_dir: str) -> dict:
    """train(cfg) of the composed overrides in this rank; the summary every rank returns."""
    from lightning_dist.config import compose_config
    from lightning_dist.train import train

    return train(compose_config([*overrides, f"paths.output_dir={run_dir}"]))
