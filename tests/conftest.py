"""Shared test setup: single-threaded torch, offline W&B, and helpers to compose real configs."""

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["WANDB_MODE"] = "offline"
os.environ.setdefault("WANDB_SILENT", "true")
# Test helpers (tests.slow_rank.SlowRank, tests.faults, ...) are named by `_target_` overrides.
os.environ.setdefault("LIGHTNING_DIST_ALLOW_TARGETS", "tests.")


@pytest.fixture
def compose(tmp_path):
    """Compose conf/train.yaml with overrides, its output dir pointed at tmp_path."""
    from lightning_dist.config import compose_config

    def _compose(*overrides: str):
        return compose_config([*overrides, f"paths.output_dir={tmp_path}"])

    return _compose
