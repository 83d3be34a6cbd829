"""bench/gpu.py without running a row: what it plans for one H200 (the rows the planner says do
not fit are skipped up front, the multi-GPU ones say how many GPUs they need), rows that do not
fit in the budget left are skipped before they start, the budget learns start-up and compile
time from measured rows, and measured rows merge into a calibration file. The rehearsal that
runs the rows is tests/e2e/test_gpu_rehearsal.py."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys

import pytest

from lightning_dist.planner.calibration import PATH, Calibration, load, save
from tests.repo import REPO_ROOT


@pytest.fixture(scope="module")
def gpu():
    spec = importlib.util.spec_from_file_location("bench_gpu", REPO_ROOT / "bench" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _rows(text: str) -> dict[str, str]:
    return {
        line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| llama")
    }


def test_plan_for_one_h200_skips_what_does_not_fit_and_predicts_every_row(gpu, capsys, tmp_path):
    """A 1B row, an 8B row and a 2-GPU row, as `python bench/gpu.py --plan dgx_h200` plans
    them (each prediction composes conf/, half a second)."""
    profile = gpu.gpu_profile(330, 10, spec="dgx_h200")
    rows = [
        gpu.ROWS[0],
        gpu.Row("large"),
        gpu.Row("small", strategy="tp", devices=2, extra=("strategy.tp=2",)),
    ]
    gpu.run_rows(profile, rows, 1, tmp_path, None)
    rows = _rows(capsys.readouterr().out)
    assert len(rows) == 3
    for name, line in rows.items():
        # every row carries the planner's tokens/s and peak memory, measured or not
        assert re.search(r"– / [\d,]+ \|", line), line
        if " x" in name:
            assert re.search(r"needs \d devices, 1 here", line)
        elif name.startswith("llama3_8b"):  # 8B's fp32 states and moments alone are 120 GiB
            assert "the planner says it does not fit: needs" in line
        else:
            assert "planned only: about" in line


def test_rows_that_do_not_fit_in_the_budget_left_never_start(gpu, tmp_path):
    profile = gpu.rehearsal_profile(budget_s=0, steps=3)
    runner = gpu.RowRunner()  # never started: no row fits in a budget of 0 s
    outcomes = gpu.run_rows(profile, gpu.ROWS[:3], 1, tmp_path, runner)
    assert [o.skipped.split(" s, ")[1] for o in outcomes] == ["0 s of the budget left"] * 3
    assert not runner.warmed and not any(o.measured for o in outcomes)
    assert not list(tmp_path.iterdir())


def test_the_budget_learns_start_up_and_compile_time_from_measured_rows(gpu):
    profile = gpu.rehearsal_profile(budget_s=100, steps=4)
    budget = gpu.Budget(profile)
    eager, compiled = gpu.Row("small"), gpu.Row("small", compile=True)
    guess = profile.startup_guess_s + 1.5 * 0.5 * 4
    assert budget.estimate(eager, 0.5) == pytest.approx(guess)
    # 10 s of wall time, 4 steps of 0.5 s (the first slower): 8 s of start-up
    budget.learn(eager, 10.0, {"step_seconds": [1.5, 0.5, 0.5, 0.5], "steps": 4})
    assert budget.estimate(eager, 0.5) == pytest.approx(8.0 + 3.0)
    budget.learn(compiled, 30.0, {"step_seconds": [9.0, 0.5, 0.5, 0.5], "steps": 4})
    assert budget.estimate(compiled, 0.5) == pytest.approx(8.0 + 20.0 + 3.0)
    # a slot not measured yet starts from the largest start-up seen
    assert budget.estimate(gpu.Row("large"), 1.0) == pytest.approx(8.0 + 6.0)


def test_measured_rows_merge_into_a_calibration_file_and_rehearsed_ones_do_not(
    gpu, tmp_path, capsys
):
    target = tmp_path / "calibration.json"
    shutil.copy(PATH, target)
    before = len(load(target).rows)
    for profile, code in (
        (gpu.rehearsal_profile(budget_s=100, steps=4), 2),
        (gpu.gpu_profile(330, 10, spec="dgx_h200"), 0),
    ):
        row = gpu.Row("small", compile=True)
        out = gpu.Outcome(
            row,
            row.name(profile.models["small"]),
            profile.overrides(row),
            measured={"tokens/s": 700.0, "MFU": None, "peak GiB": 4.4e8},
            predicted={"tokens/s": 900.0, "MFU": None, "peak GiB": 5.0e8},
            planner_layout="dp_shard=1",
        )
        rows = gpu.calibration_rows(profile, [out], "cpu", "a device")
        memory = "memory.process_bytes" if profile.rehearsal else "memory.total_bytes"
        assert [(r.quantity, r.measured, r.predicted) for r in rows] == [
            ("time.tokens_per_sec_per_device", 700.0, 900.0),
            (memory, 4.4e8, 5.0e8),
        ]
        assert rows[0].overrides == tuple(profile.overrides(row))
        assert rows[0].seq_len == profile.seq_len["small"]
        save(Calibration(rows=tuple(rows)), tmp_path / "gpu-rows.json")
        assert gpu.merge(tmp_path / "gpu-rows.json", into=target) == code
        assert gpu.merge(tmp_path / "gpu-rows.json", into=target) == code  # replaces, or refuses
    assert "holds measured-cpu rows (a --rehearse run's)" in capsys.readouterr().err
    assert len(load(target).rows) == before + 2


def test_only_and_rows_pick_rows_by_slot_and_name(gpu, capsys):
    """The suite's rehearsal (tests/e2e/test_gpu_rehearsal.py) runs each code path once; a
    pattern that matches nothing or does not parse stops with one line."""
    from tests.e2e.test_gpu_rehearsal import ROWS

    profile = gpu.rehearsal_profile(budget_s=100, steps=4)
    names = [row.name(profile.models[row.slot]) for row in gpu.selected(profile, "small", ROWS)]
    assert names == [
        "llama_debug 3d fp8 ac=op compile",
        "llama_debug 3d bf16 ac=full",
        "llama_debug fsdp2 bf16 ac=op",
        "llama_debug fsdp2 x2 bf16 ac=op",
        "llama_debug tp x2 bf16 ac=op",
        "llama_debug pp x2 bf16 ac=op",
        "llama_debug 3d x8 bf16 ac=op",
    ]
    assert len(gpu.selected(profile, None, None)) == len(gpu.ROWS)
    assert gpu.main(["--rehearse", "--rows", "no such row"]) == 2
    assert "error: no row matches --rows 'no such row';" in capsys.readouterr().err
    assert gpu.main(["--plan", "dgx_h200", "--only", "large", "--rows", "fsdp2 x"]) == 2
    assert "error: no row matches --only 'large' --rows 'fsdp2 x';" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        gpu.main(["--rehearse", "--rows", "fp8("])
    assert stop.value.code == 2
    assert "'fp8(' is not a regular expression" in capsys.readouterr().err
