"""A strategy added through the contract alone (tests/toy_strategy.py, its schema and
tests/toy_conf/strategy/toy.yaml), run through tests/toy_train.py: its own check stops a 3-rank run
with one line before any process starts, its activation-checkpointing setting reaches the
planner's prediction, and a real 2-rank run records its layout, throughput and memory. (The
package's import layers are tests/unit/test_layers.py.)"""

from pathlib import Path

import lightning_dist

PACKAGE = Path(lightning_dist.__file__).parent


# --- a strategy added through the contract alone ------------------------------------------------

TOY = Path(__file__).parents[1] / "toy_train.py"


def _toy(*overrides: str, tmp_path: Path):
    import os
    import subprocess
    import sys

    return subprocess.run(
        [
            sys.executable,
            str(TOY),
            "strategy=toy",
            "debug=fast",
            f"hydra.run.dir={tmp_path}",
            *overrides,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=PACKAGE.parent,
        env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"},
    )


def test_a_toy_strategy_gets_checks_planner_settings_and_telemetry(tmp_path):
    """tests/toy_strategy.py + its schema + tests/toy_conf/strategy/toy.yaml, nothing else."""
    import json

    # Pre-flight: the toy's own check stops a 3-rank run with one line, before any process.
    bad = _toy("hardware.devices=3", tmp_path=tmp_path / "bad")
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode == 2 and len(errors) == 1, bad.stderr[-2000:]
    assert "power-of-two world size, got 3" in errors[0]
    # Planner: the toy's settings (activation checkpointing) reach the prediction.
    plan = _toy(
        "hardware=dgx_h100",
        "model=llama3_1b",
        "data.global_batch_size=64",
        "plan.only=true",
        tmp_path=tmp_path / "plan",
    )
    layout_line = next(line for line in plan.stdout.splitlines() if "layout:" in line)
    assert "dp_replicate=8" in layout_line and layout_line.rstrip().endswith("ac=full"), plan.stdout
    # Telemetry: a real 2-rank run records the toy's layout, throughput and memory.
    run = _toy("hardware.devices=2", "trainer.max_steps=3", tmp_path=tmp_path / "run")
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["strategy"] == "toy" and summary["world_size"] == 2
    assert summary["layout"] == {"pp": 1, "dp_replicate": 2, "dp_shard": 1, "cp": 1, "tp": 1}
    assert summary["steps"] == 3 and summary["tokens_per_sec"] > 0
    assert len(summary["memory_by_category"]) == 2
    # debug=fast logs to no experiment logger, and says so once (run/build.py note_no_logger).
    assert run.stdout.count("debug=fast: no experiment logger, W&B is off; add logger=wandb") == 1
