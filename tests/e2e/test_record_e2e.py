"""What a user sees, through train.py: one record of the losses (console, summary.json, metrics
CSV, W&B offline without a network), the console's closing summary, and the default run on real
text: the summary contract, learning and a quiet console. (The record's pieces in one process
are tests/unit/test_record.py; the multiruns are tests/e2e/test_sweep_e2e.py.)"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import pytest

from lightning_dist.runtime.record import smoothed_final_loss
from tests.repo import REPO_ROOT

FAST = ["model=llama_debug", "data=synthetic", "logger=none", "trainer.val_check_interval=null"]
STEP_LINE = re.compile(r"^step (\d+)/\d+ \| loss (\d+\.\d+)", re.MULTILINE)
TIPS = ("litlogger", "srun", "anonymous setting", "broadcast_buffers")


def train_py(
    *args: str, timeout: float = 600, env: dict | None = None, unset: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", **(env or {})}
    for name in unset:
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "train.py"), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def assert_quiet(output: str) -> None:
    """No kineto USDT line; each third-party hint at most once in the whole output."""
    assert "USDT" not in output
    for tip in TIPS:
        assert output.count(tip) <= 1, f"{tip!r} printed {output.count(tip)} times"


# --- end to end ---------------------------------------------------------------------------------


WANDB_FIELDS = [
    "logger.entity=planted-team",
    "logger.group=sweep-a",
    "logger.job_type=train",
    "logger.notes='a short run'",
    "logger.tags=[ddp,short]",
]
WANDB_METADATA = {
    "project": "lightning_dist",
    "entity": "planted-team",
    "group": "sweep-a",
    "job_type": "train",
    "notes": "a short run",
    "tags": ["ddp", "short"],
}
"""What the W&B run must start with, given `WANDB_FIELDS`."""


@pytest.mark.slow
def test_console_summary_metrics_and_wandb_hold_the_same_loss_per_step(tmp_path):
    """The console's `step N | loss X` is summary.json's losses[N-1], the metrics CSV's and
    W&B's row at Lightning's logger step N-1 (lightning_dist.runtime.record.LOGGER_STEP_OFFSET),
    for every step of a run shorter than any logging interval (trainer.log_every_n_steps is
    left at its default).

    W&B is logged in (a planted API key) but its server is a closed port and WANDB_MODE is
    unset: the run says so in one warning line and logs offline, with the config, the metrics
    and the summary in its transaction log and the key in no file of the run. The run's entity,
    group, job type, notes and tags are the `logger.*` overrides."""
    from wandb_records import history, run_metadata

    from tests.unit.test_bad_inputs import _no_network

    steps = 5
    network = _no_network()
    secret = network["WANDB_API_KEY"] = "planted0secret0key0value0000000000000000"
    result = train_py(
        *FAST,
        "logger=wandb",
        f"trainer.max_steps={steps}",
        *WANDB_FIELDS,
        "callbacks.progress.plain_every_n_steps=1",
        f"hydra.run.dir={tmp_path}",
        env=network,
        unset=("WANDB_MODE",),
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "W&B server unreachable" in warnings[0], result.stderr[-3000:]
    assert "wandb sync" in result.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    losses = summary["losses"]
    assert len(losses) == steps and summary["final_loss"] == losses[-1]

    console = {int(n): float(x) for n, x in STEP_LINE.findall(result.stdout)}
    assert sorted(console) == list(range(1, steps + 1))
    for n, shown in console.items():
        assert shown == pytest.approx(losses[n - 1], abs=5e-5), f"console step {n}"

    with (tmp_path / "metrics" / "metrics.csv").open() as f:
        csv_loss = {
            int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")
        }
    assert csv_loss == {n - 1: pytest.approx(losses[n - 1], rel=1e-6) for n in console}

    (log,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    assert run_metadata(log) == WANDB_METADATA
    wandb_loss = {
        r["trainer/global_step"]: r["train/loss"] for r in history(log) if "train/loss" in r
    }
    assert wandb_loss == {n - 1: pytest.approx(losses[n - 1], rel=1e-6) for n in console}
    records = log.read_bytes()  # config, history and summary
    for expected in (b"dp_replicate", b'"dim"', b"train/loss", b"summary/final_loss"):
        assert expected in records, f"{expected!r} missing from {log.name}"
    for path in (tmp_path / "wandb").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"API key leaked into {path}"

    assert f"loss {losses[-1]:.4f} at step {steps}" in result.stdout  # the closing summary
    assert summary["final_loss_smoothed"] == pytest.approx(smoothed_final_loss(losses))
    assert_quiet(result.stdout + result.stderr)


SUMMARY_KEYS = {
    "losses", "final_loss", "steps", "tokens_per_sec", "world_size", "layout", "strategy",
    "hardware", "peak_memory_bytes", "mfu", "wall_seconds",
}  # fmt: skip


@pytest.mark.slow
def test_default_run_learns_on_real_text_and_prints_no_usdt_line_and_each_tip_once(tmp_path):
    """`python train.py` as in the README (shortened to 25 steps): real text (stdlib sources),
    two DDP ranks, W&B offline, telemetry on (so the profiler runs), a validation. It keeps the
    summary contract, learns, writes one run directory and keeps the console quiet."""
    result = train_py(
        "trainer.max_steps=25",
        "trainer.val_check_interval=25",
        "data.global_batch_size=8",
        "data.seq_len=128",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    output = result.stdout + result.stderr
    assert_quiet(output)
    assert "communication takes" not in output  # a tiny step: no comm/compute warning
    assert "validation loss" in result.stdout and "run finished: 25 steps" in result.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert SUMMARY_KEYS <= summary.keys()
    assert summary["steps"] == 25 and len(summary["losses"]) == 25
    assert summary["world_size"] == 2 and summary["layout"]["dp_replicate"] == 2
    assert len(summary["peak_memory_bytes"]) == 2 and min(summary["peak_memory_bytes"]) > 0
    assert summary["mfu"] is None  # no peak FLOP/s is known for a CPU
    assert summary["final_loss"] < 0.75 * summary["losses"][0]
    assert summary["val_losses"] and summary["val_losses"][-1] < summary["losses"][0]
    # One run directory: no per-rank Hydra output folders, no stray config copies.
    assert not (tmp_path / "outputs").exists()
    # The report is made at the end (report=true by default), and the summary names the command.
    assert sorted(p.name for p in (tmp_path / "report").iterdir())[0] == "README.md"
    assert f"report: {tmp_path / 'report'}" in result.stdout
    assert summary["command"].startswith("python ") and "trainer.max_steps=25" in summary["command"]
