"""Multiruns through train.py: over every distributed strategy and over changing numbers of
ranks, one directory per job and one comparison table. A module of their own, so that the
suite's workers (`--dist loadfile`) run them beside the record tests of test_record_e2e.py."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_record_e2e import FAST, assert_quiet, train_py


@pytest.mark.slow
def test_multirun_over_every_distributed_strategy(tmp_path):
    """Each job starts its own ranks: before, the second distributed job reused the first's
    finished process group and failed in gloo. Then one table compares them."""
    strategies = ["ddp", "fsdp2", "3d"]  # FSDP1 too until 2026-12-03 (suite time)
    result = train_py(
        "-m",
        f"strategy={','.join(strategies)}",
        *FAST,
        "trainer.max_steps=3",
        "hardware.devices=2",
        f"hydra.sweep.dir={tmp_path}",
        timeout=900,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    summaries = [json.loads((tmp_path / str(i) / "summary.json").read_text()) for i in range(3)]
    assert [s["strategy"] for s in summaries] == strategies
    for s in summaries:
        assert s["steps"] == 3 and len(s["losses"]) == 3 and s["world_size"] == 2
        assert s["final_loss_smoothed"] is not None and len(s["peak_memory_bytes"]) == 2
        # The layout is an implementation detail: the same losses whatever the strategy.
        assert s["losses"] == pytest.approx(summaries[0]["losses"], rel=1e-4)
    table = (tmp_path / "comparison.md").read_text()
    for i, strategy in enumerate(strategies):
        assert f"| {i} | strategy={strategy} | 2 | 3 |" in table
    rows = json.loads((tmp_path / "comparison.json").read_text())
    assert [r["final_loss"] for r in rows] == [s["final_loss"] for s in summaries]
    assert "compared in" in result.stdout
    assert_quiet(result.stdout + result.stderr)


@pytest.mark.slow
def test_multirun_changes_the_number_of_ranks_between_jobs(tmp_path):
    """4 ranks, then 1, then 2: each job has the world size it asked for."""
    result = train_py(
        "-m",
        "strategy=ddp",
        "hardware.devices=4,1,2",
        *FAST,
        "trainer.max_steps=2",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    sizes = [
        json.loads((tmp_path / str(i) / "summary.json").read_text())["world_size"] for i in range(3)
    ]
    assert sizes == [4, 1, 2]
