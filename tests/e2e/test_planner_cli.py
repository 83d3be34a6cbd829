"""Fresh interpreters: the planner imports no torch, and every CLI runs under its public name
(`python -m lightning_dist.plan|parity|report|sweep|checkpoint|launch|calibration_report`)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_planner_does_not_import_torch():
    code = "import sys, lightning_dist.planner, lightning_dist.planner.search; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "cli", ["plan", "parity", "report", "sweep", "checkpoint", "launch", "calibration_report"]
)
def test_every_cli_runs_under_its_public_name(cli):
    """`python -m lightning_dist.<cli> --help`, as the README and docs spell them; the planner
    also answers a real question (its table and its exit status)."""
    out = subprocess.run(
        [sys.executable, "-m", f"lightning_dist.{cli}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr[-2000:]
    if cli == "plan":
        table = subprocess.run(
            [
                sys.executable,
                "-m",
                "lightning_dist.plan",
                "model=llama3_8b",
                "hardware=dgx_h100",
                "--top",
                "1",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert table.returncode == 0 and "chosen:" in table.stdout, table.stderr[-2000:]


def test_dry_run_prints_each_rank_beside_the_planner():
    """`--dry-run` (train.py plan.dry_run=true; its ranks fork): a pp2 x tp2 x fsdp2 layout of 8
    fake ranks on DGX H100s prints the first and last pipeline ranks' bytes with the planner's,
    model states within 2%. (What it refuses, strategy=ddp and strategy.cp=2 among them, is in
    tests/unit/test_bad_inputs.py, one line each; a refused config's exit status 2 is
    tests/e2e/test_bad_inputs_e2e.py's.)"""
    base = ["model=llama_debug", "hardware=dgx_h100", "data.global_batch_size=8", "data.seq_len=64"]
    command = [sys.executable, "-m", "lightning_dist.plan", *base, "--dry-run"]
    run = subprocess.run(
        [*command, "strategy=3d", "strategy.pp=2", "strategy.tp=2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout
    rows = [line.split() for line in out.splitlines() if "model states GiB" in line]
    assert [r[0] for r in rows] == ["0", "4"], out
    assert all(abs(float(r[-1].rstrip("%"))) <= 2.0 for r in rows), out
    assert "pp GiB/step" in out and "tp GiB/step" in out and "dp_shard GiB/step" in out, out
