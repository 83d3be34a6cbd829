"""Interleaved train.py runs for the slow-links benchmarks (bench/slow_devices.py, bench/diloco.py):
each repeat runs every configuration once, in turn (A B A B ...), so drift on the shared machine
hits all alike; each run is bounded (bench/bounded.py) and read back from its summary.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bounded import run_bounded

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
QUIET = [
    "~callbacks.comm",
    "trainer.memory_by_category_step=0",
    "logger=none",
    "trainer.val_check_interval=null",
    "trainer.num_sanity_val_steps=0",
]
"""Telemetry a timing does not need (the comm monitor's profiled step, MemTracker's step)."""


def train(overrides: list[str], run_dir: Path, timeout_s: float = 900.0) -> dict:
    """One `python train.py OVERRIDES` run; its summary.json. RuntimeError with the output's
    cause if it failed or hung."""
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    outcome = run_bounded(cmd, timeout_s=timeout_s, env=ENV, cwd=ROOT)
    summary = run_dir / "summary.json"
    if outcome.status != "ok" or not summary.exists():
        raise RuntimeError(outcome.line(" ".join(overrides)) + "\n" + outcome.output[-3000:])
    return json.loads(summary.read_text())


def interleaved(
    configs: dict[str, list[str]],
    repeats: int,
    describe: Callable[[dict], str],
    *,
    log: Callable[[str], None] = print,
) -> dict[str, list[dict]]:
    """The summary.json of each configuration in each of `repeats` rounds, run A B A B ...;
    `describe(summary)` is logged after each run."""
    summaries: dict[str, list[dict]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory(prefix="bench-slow-") as tmp:
        for repeat in range(repeats):
            for name, overrides in configs.items():
                summary = train(
                    overrides, Path(tmp) / f"{repeat}-{len(summaries[name])}-{id(name)}"
                )
                summaries[name].append(summary)
                log(f"  repeat {repeat + 1}/{repeats} {name}: {describe(summary)}")
    return summaries


def max_loss_difference(a: dict, b: dict) -> float:
    """The largest relative difference of two runs' per-step train losses."""
    return max(abs(x - y) / abs(y) for x, y in zip(a["losses"], b["losses"], strict=True))


def spread(values: list[float]) -> str:
    """`median (min-max)`."""
    return f"{statistics.median(values):.4g} ({min(values):.4g}-{max(values):.4g})"


def ratios(a: list[float], b: list[float]) -> list[float]:
    """a / b, repeat by repeat (the pairs ran next to each other)."""
    return [x / y for x, y in zip(a, b, strict=True)]
