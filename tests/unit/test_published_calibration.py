"""The planner against published runs (lightning_dist/calibration_report.py): the stored published rows
of planner/calibration.json are the current planner's predictions, and every row of the sources
its constants were fitted to meets its target (torchtitan's H100 tokens/s within 15% and
reserved memory within 10%, Megatron-LM's percent of peak within 5 points); llm-foundry's rows
and the leave-one-source-out errors are printed with their misses (docs/PLANNER.md)."""

from __future__ import annotations

import pytest

from lightning_dist.calibration_report import main
from lightning_dist.planner.calibration import load
from lightning_dist.planner.calibration_errors import TARGETS, row_error, select
from lightning_dist.published.runs import published_rows


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


def test_time_rows_of_the_fitted_sources_meet_their_targets(live):
    """torchtitan's and Megatron's rows; llm-foundry's 15 are fitted with them but not pinned
    (7 miss, printed). Megatron's smallest models pass since the shape penalty follows the
    device's matmul rate over its bandwidth (GPT 1.7B: -2.8 points, was -6.3 with the H100
    table's penalty on the A100: docs/PLANNER.md, "llm-foundry, and leave-one-source-out")."""
    time_rows = [
        r for r in live if r.quantity.startswith("time.") and "llm-foundry" not in r.origin
    ]
    assert len(time_rows) == 16
    assert sum("llm-foundry" in r.origin for r in live) == 15
    missed = {
        r.model: row_error(r)
        for r in time_rows
        if abs(row_error(r)) > TARGETS[(r.source, r.quantity)]
    }
    assert missed == {}


def test_memory_rows_meet_their_targets(live):
    memory = {r.layout: row_error(r) for r in live if r.quantity == "memory.reserved_bytes"}
    assert len(memory) == 6
    for layout, error in memory.items():
        assert abs(error) <= TARGETS[("published", "memory.reserved_bytes")], (layout, error)
    # compile drops w2's output from every block (torchtitan: 5.4 and 5.0 GiB less)
    assert memory["fsdp 8 compile"] < memory["fsdp 8"] + 0.02


def test_the_command_prints_every_row_with_its_error(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.count("| published |") == 37 + 12 and "| measured-cpu |" in out
    assert "GPT 1008B" in out and "-0.4 pt" in out
    assert "37 published rows, 30 within their targets; missed: MPT-70b H100 x64" in out
    assert "12 held-out rows, 10 within the same targets" in out
    # Beside each time row: as shipped, in-sample and leave-one-source-out.
    assert out.count("| torchtitan |") == 6 and out.count("| llm-foundry |") == 15
    assert "31 published time rows, 27 within their targets left out of the fit" in out


def test_the_plans_band_is_the_stored_fits_leave_one_source_out_percentiles():
    from lightning_dist.published import holdout

    stored = holdout.load_fits()
    errors = [
        e for s in holdout.SOURCES for _, e, _ in holdout.relative_errors(stored["fits"][s], s)
    ]
    assert stored["band"] == pytest.approx(holdout.band(errors), abs=1e-9)
    low, high = holdout.prediction_band(46000)
    assert low < 46000 < high


def test_the_held_out_time_rows_meet_the_time_target():
    """No constant was fitted to them. The closest time row to the target: the 70B bf16 row,
    -14.4% (docs/PLANNER.md, "Held out"); of the five memory rows, the two that miss are the
    ones that section explains (the H200 run meets it with its compiled loss counted)."""
    from lightning_dist.published.runs import held_out_rows

    rows = held_out_rows()
    time_rows = [r for r in rows if r.quantity.startswith("time.")]
    assert len(time_rows) == 7
    missed = {
        (r.layout, r.quantity) for r in rows if abs(row_error(r)) > TARGETS[(r.source, r.quantity)]
    }
    assert missed == {
        ("70B fsdp 32 x tp 8", "memory.reserved_bytes"),
        ("405B fsdp 8 x tp 8 x pp 8 1F1B", "memory.reserved_bytes"),
    }


def test_the_torchtitan_rows_overrides_build_the_predicted_layout():
    """The overrides stored with a row are the run the planner predicted: FSDP over every GPU."""
    from omegaconf import OmegaConf

    from lightning_dist.config import compose_config, hardware_spec
    from lightning_dist.options import PRESETS
    from lightning_dist.published.runs import TORCHTITAN_RUNS, torchtitan_overrides

    for run in TORCHTITAN_RUNS:
        cfg = compose_config([*torchtitan_overrides(run), "paths.output_dir=."])
        strategy = OmegaConf.to_container(cfg.strategy, resolve=True)
        knobs = {k: v for k, v in strategy.items() if k not in ("name", "_target_")}
        hw = hardware_spec(cfg)
        layout = PRESETS["fsdp2"].build(knobs, "strategy").declared_layout(hw.num_nodes)
        assert layout.resolve(hw.world_size).degrees()["dp_shard"] == run.gpus
        assert cfg.data.global_batch_size == 2 * run.gpus and cfg.data.micro_batch_size == 2
