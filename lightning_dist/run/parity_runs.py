"""Training runs in processes of their own and the comparison of their losses, for the parity
CLI (`python -m lightning_dist.parity`, `lightning_dist/parity.py`), the calibration
(`run/calibrate.py`), the benchmarks and the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REFERENCE = ["strategy=single", "hardware.devices=1"]


def run_train(overrides: list[str], run_dir: str | Path, *, timeout: float = 900) -> dict:
    """Run `python train.py OVERRIDES` in its own process with `run_dir` as the Hydra run
    directory; return its summary.json. Raises RuntimeError with the output tail on failure."""
    run_dir = Path(run_dir)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, "-m", "lightning_dist", *overrides, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    summary_path = run_dir / "summary.json"
    if proc.returncode != 0 or not summary_path.exists():
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise RuntimeError(f"train.py {' '.join(overrides)} exited {proc.returncode}:\n{tail}")
    return json.loads(summary_path.read_text())


def reference_overrides(candidate: list[str]) -> list[str]:
    """The candidate's overrides with the strategy and device count replaced by one process."""

    def is_layout(o: str) -> bool:
        key = o.lstrip("+~").split("=", 1)[0]
        return key == "strategy" or key.startswith("strategy.") or key == "hardware.devices"

    return [o for o in candidate if not is_layout(o)] + REFERENCE


def max_relative_difference(reference: list[float], candidate: list[float]) -> float:
    if len(reference) != len(candidate):
        return float("inf")
    return max(
        (abs(c - r) / max(abs(r), 1e-12) for r, c in zip(reference, candidate, strict=True)),
        default=0.0,
    )


def compare(candidate: list[str], *, tolerance: float, workdir: str | Path) -> tuple[float, str]:
    """Run reference and candidate; return (max relative difference, printable table)."""
    base = [] if any(o.startswith("logger=") for o in candidate) else ["logger=none"]
    workdir = Path(workdir)
    ref = run_train(base + reference_overrides(candidate), workdir / "reference")
    cand = run_train(base + candidate, workdir / "candidate")
    diff = max_relative_difference(ref["losses"], cand["losses"])
    lines = [f"{'step':>4}  {'reference':>12}  {'candidate':>12}  {'rel diff':>9}"]
    for i, (r, c) in enumerate(zip(ref["losses"], cand["losses"], strict=False), start=1):
        lines.append(f"{i:>4}  {r:>12.7f}  {c:>12.7f}  {abs(c - r) / max(abs(r), 1e-12):>9.2e}")
    verdict = "PASS" if diff <= tolerance else "FAIL"
    lines.append(
        f"max relative difference {diff:.3e} over {len(ref['losses'])} steps "
        f"(tolerance {tolerance:.0e}, candidate world size {cand['world_size']}): {verdict}"
    )
    return diff, "\n".join(lines)
