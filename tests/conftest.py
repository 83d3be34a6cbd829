"""Shared test setup: single-threaded torch, offline W&B, and helpers to compose real configs."""

import os
import sys

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


@pytest.fixture(autouse=True)
def _launcher_mark_not_left_behind():
    """An in-process run marks this process as the launcher of its ranks
    (`strategies.launch.LAUNCHER_PID`): a train.py that a later test of the same worker starts
    would take itself for one of those ranks and exit 0 where its job's status is due (the
    fenced-out run's 5 read 0 when a unit test had run first in its worker)."""
    before = os.environ.copy()
    yield
    launch = sys.modules.get("lightning_dist.strategies.launch")
    if launch is None:
        return
    name = launch.LAUNCHER_PID
    if name in before:
        os.environ[name] = before[name]
    else:
        os.environ.pop(name, None)
