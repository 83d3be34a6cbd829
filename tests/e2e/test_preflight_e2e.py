"""train.py's pre-flight check: plan.only on a machine without GPUs, and a layout predicted
not to fit stops with the numbers and the planner's suggestion."""

import os
import subprocess
import sys

from lightning_dist.parity import REPO_ROOT


def _train(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / "train.py"), *overrides],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip


def test_plan_only_works_without_gpus():
    result = _train("strategy=fsdp", "hardware=dgx_h100", "model=llama3_70b", "plan.only=true")
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "plan for strategy=fsdp on dgx_h100" in result.stdout
    assert "fits: no" in result.stdout and "planner suggests" in result.stdout
    assert result.returncode == 1  # 70B does not fit on 8 x 80 GiB with plain FSDP


def test_layout_predicted_not_to_fit_stops_before_launch():
    result = _train("strategy=ddp", "hardware=dgx_h100", "model=llama3_8b")
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-2000:]
    assert "GiB/device, has 80" in errors[0] and "planner suggests" in errors[0]
    assert "plan.check=false" in errors[0]


def test_strategy_auto_runs_the_planners_layout(tmp_path):
    from lightning_dist.parity import max_relative_difference, run_train

    common = ["debug=fast", "trainer.max_steps=4"]
    auto = run_train([*common, "strategy=auto", "hardware.devices=2"], tmp_path / "auto")
    single = run_train([*common, "strategy=single"], tmp_path / "single")
    assert auto["strategy"] == "auto" and auto["world_size"] == 2
    assert (
        auto["layout"]["pp"]
        * auto["layout"]["tp"]
        * auto["layout"]["dp_shard"]
        * auto["layout"]["dp_replicate"]
        == 2
    )
    assert max_relative_difference(single["losses"], auto["losses"]) < 1e-4
