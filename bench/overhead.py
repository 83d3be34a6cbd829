"""What do the Lightning plugins cost over a hand-written PyTorch loop?

    python bench/overhead.py [--steps 20] [--warmup 5] [--repeats 3]

For DDP and FSDP2 on 2 CPU ranks (gloo), runs three things on the same model, data, global
batch and seed, interleaved `--repeats` times so that drift hits all alike:

- raw:  bench/raw_loop.py under torchrun (under fsdp2, sharded with train.py's FSDP settings);
- bare: train.py with every callback off (`callbacks=none`, `logger=none`);
- full: train.py with the default callbacks (progress, throughput/MFU, comm/stragglers).

It prints the median steps/s of each after `--warmup` steps, the ratios bare/raw, full/raw
(train.py as users run it against the raw loop: the issue's bar is 0.99) and full/bare with
their spread over the repeats, and appends the table to docs/BENCHMARKS.md with --write.
Bare runs show Lightning's own progress bar (it stands in when no progress callback is given).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMON = ["model=tiny", "data=synthetic", "data.seq_len=256", "data.global_batch_size=16"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}


def raw(strategy: str, steps: int, out: Path) -> list[float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "bench" / "raw_loop.py"), "--strategy", strategy, "--steps", str(steps),
           "--out", str(out), *COMMON]  # fmt: skip
    _run(cmd)
    return json.loads(out.read_text())["step_seconds"]


def lightning(strategy: str, steps: int, run_dir: Path, callbacks: bool) -> list[float]:
    extra = [] if callbacks else ["callbacks=none"]
    cmd = [sys.executable, str(ROOT / "train.py"), *COMMON, f"strategy={strategy}",
           "hardware.devices=2", "logger=none", f"trainer.max_steps={steps}",
           "trainer.val_check_interval=null", *extra, f"hydra.run.dir={run_dir}"]  # fmt: skip
    _run(cmd)
    return json.loads((run_dir / "summary.json").read_text())["step_seconds"]


RUN_TIMEOUT_S = 900
"""One run takes under a minute here; past this it is hung, and the benchmark stops."""


def _run(cmd: list[str]) -> None:
    try:
        proc = subprocess.run(
            cmd, env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        sys.exit(f"error: {' '.join(cmd[:6])}... ran past {RUN_TIMEOUT_S} s and was killed")
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd[:6])}... exited {proc.returncode}:\n{proc.stderr[-3000:]}")


def _ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    """Per-repeat ratios: each repeat's runs ran back to back, under the same load."""
    return [n / d for n, d in zip(numerators, denominators, strict=True)]


def steps_per_sec(step_seconds: list[float], warmup: int) -> float:
    return 1.0 / statistics.median(step_seconds[warmup:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strategies", nargs="+", default=["ddp", "fsdp2"])
    parser.add_argument("--write", action="store_true", help="append to docs/BENCHMARKS.md")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for strategy in args.strategies:
            rates = {"raw": [], "bare": [], "full": []}
            for rep in range(args.repeats):
                rates["raw"].append(
                    steps_per_sec(raw(strategy, args.steps, tmp / "raw.json"), args.warmup)
                )
                for name, cb in (("bare", False), ("full", True)):
                    times = lightning(strategy, args.steps, tmp / f"{strategy}-{name}-{rep}", cb)
                    rates[name].append(steps_per_sec(times, args.warmup))
                print(f"{strategy} repeat {rep + 1}: " + ", ".join(
                    f"{k} {v[-1]:.3f} steps/s" for k, v in rates.items()), flush=True)  # fmt: skip
            ratios = {
                "off / raw": _ratios(rates["bare"], rates["raw"]),
                "on / raw": _ratios(rates["full"], rates["raw"]),
                "on / off": _ratios(rates["full"], rates["bare"]),
            }
            rows.append((strategy, rates, ratios))
    lines = [
        "| strategy | raw steps/s | train.py, callbacks off | train.py, callbacks on | "
        "off / raw (min-max) | on / raw (min-max) | on / off (min-max) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for strategy, rates, ratios in rows:
        med = {k: statistics.median(v) for k, v in rates.items()}
        lines.append(
            f"| {strategy} | {med['raw']:.3f} | {med['bare']:.3f} | {med['full']:.3f} | "
            + " | ".join(
                f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})" for r in ratios.values()
            )
            + " |"
        )
    table = "\n".join(lines)
    print(table)
    if args.write:
        header = (
            f"\n## Overhead over a raw PyTorch loop ({datetime.date.today()})\n\n"
            f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, 2 gloo ranks, "
            f"OMP_NUM_THREADS=1. Command: `python bench/overhead.py --steps {args.steps} "
            f"--warmup {args.warmup} --repeats {args.repeats}`. Median steps/s after warm-up; "
            f"ratios per repeat, median (min-max).\n\n"
        )
        with open(ROOT / "docs" / "BENCHMARKS.md", "a") as f:
            f.write(header + table + "\n")


if __name__ == "__main__":
    main()
