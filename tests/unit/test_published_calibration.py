"""The planner against published runs (lightning_dist/calibration_report.py): the stored published rows
of planner/calibration.json are the current planner's predictions, and the time rows meet their
targets (torchtitan's H100 tokens/s within 15%, Megatron-LM's percent of peak within 5 points).
Of the memory rows, the one without torch.compile on 8 GPUs meets its 10%; the others are over
it (docs/PLANNER.md says why) and are held where they are, so a regression still shows."""

from __future__ import annotations

import pytest

from lightning_dist.calibration_report import main, published_rows
from lightning_dist.planner.calibration import TARGETS, load, row_error, select


@pytest.fixture(scope="module")
def live():
    return published_rows()


def test_the_stored_published_rows_are_the_planners_current_predictions(live):
    stored = {r.key: r for r in select(load().rows, source="published")}
    assert stored.keys() == {r.key for r in live}, (
        "run python -m lightning_dist.calibration_report --write"
    )
    for row in live:
        assert stored[row.key].predicted == pytest.approx(row.predicted, rel=1e-9), row.describe()


def test_time_rows_meet_their_targets(live):
    time_rows = [r for r in live if r.quantity.startswith("time.")]
    assert len(time_rows) == 16
    for row in time_rows:
        assert abs(row_error(row)) <= TARGETS[(row.source, row.quantity)], (
            row.describe(),
            row_error(row),
        )


def test_memory_rows(live):
    memory = {r.layout: row_error(r) for r in live if r.quantity == "memory.process_bytes"}
    assert abs(memory["fsdp 8"]) <= TARGETS[("published", "memory.process_bytes")]
    # Over the 10% target today (compile's fusion and torchtitan's lighter op policy save
    # memory the planner does not model): held at their current errors plus a point.
    assert 0 < memory["fsdp 128"] <= 0.12 and 0 < memory["fsdp 8 compile"] <= 0.16
    assert 0 < memory["fsdp 128 compile"] <= 0.21
    # float8 changes no memory term of the planner (torchao saves what bf16 saves)
    assert 0 < memory["fsdp 8 compile float8"] <= 0.16
    assert 0 < memory["fsdp 128 compile float8"] <= 0.21


def test_the_command_prints_every_row_with_its_error(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.count("| published |") == 22 and "| measured-cpu |" in out
    assert "GPT 1008B" in out and "+7.0%" in out
    assert "22 published rows, 17 within their targets" in out


def test_the_torchtitan_rows_overrides_build_the_predicted_layout():
    """The overrides stored with a row are the run the planner predicted: FSDP over every GPU."""
    from omegaconf import OmegaConf

    from lightning_dist.calibration_report import TORCHTITAN_RUNS, torchtitan_overrides
    from lightning_dist.config import compose_config, hardware_spec
    from lightning_dist.options import PRESETS

    for run in TORCHTITAN_RUNS:
        cfg = compose_config([*torchtitan_overrides(run), "paths.output_dir=."])
        strategy = OmegaConf.to_container(cfg.strategy, resolve=True)
        knobs = {k: v for k, v in strategy.items() if k not in ("name", "_target_")}
        hw = hardware_spec(cfg)
        layout = PRESETS["fsdp2"].build(knobs, "strategy").declared_layout(hw.num_nodes)
        assert layout.resolve(hw.world_size).degrees()["dp_shard"] == run.gpus
        assert cfg.data.global_batch_size == 2 * run.gpus and cfg.data.micro_batch_size == 2
