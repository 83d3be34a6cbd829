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
Bare runs show train.py's plain progress lines (its stand-in when no progress callback is
given; Lightning's would be a Rich bar with a rendering thread).
Every run is bounded by its measured step time (bench/bounded.py); one that hangs or fails is
reported in one line and run once more, and a repeat that fails twice is marked in the table
("1 of 5 failed") instead of ending the benchmark.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

from bounded import run_bounded, timeout_for

ROOT = Path(__file__).resolve().parent.parent
COMMON = ["model=tiny", "data=synthetic", "data.seq_len=256", "data.global_batch_size=16"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}


def raw_command(strategy: str, steps: int, out: Path) -> tuple[list[str], Path]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "bench" / "raw_loop.py"), "--strategy", strategy, "--steps", str(steps),
           "--out", str(out), *COMMON]  # fmt: skip
    return cmd, out


def lightning_command(strategy: str, steps: int, run_dir: Path, callbacks: bool):
    extra = [] if callbacks else ["callbacks=none"]
    cmd = [sys.executable, str(ROOT / "train.py"), *COMMON, f"strategy={strategy}",
           "hardware.devices=2", "logger=none", f"trainer.max_steps={steps}",
           "trainer.val_check_interval=null", *extra, f"hydra.run.dir={run_dir}"]  # fmt: skip
    return cmd, run_dir / "summary.json"


class Runner:
    """Runs each command bounded (bench/bounded.py: startup plus 10x the median step time seen
    so far for that kind of run); a run that hangs or fails is reported in one line and run once
    more; a second failure gives None, which the table marks, and the benchmark goes on."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.step_seconds: dict[str, list[float]] = {}
        self.failed: list[str] = []

    def times(self, kind: str, cmd: list[str], result: Path) -> list[float] | None:
        for attempt in (1, 2):
            bound = timeout_for(self.steps, self.step_seconds.get(kind))
            outcome = run_bounded(cmd, timeout_s=bound, env=ENV, cwd=ROOT)
            note = "run once more" if attempt == 1 else "this repeat is marked failed"
            if outcome.status == "ok":
                try:
                    times = json.loads(result.read_text())["step_seconds"]
                except (OSError, ValueError, KeyError) as e:
                    print(
                        f"warning: {kind}: finished but wrote no step times ({e}; {note})",
                        file=sys.stderr,
                        flush=True,
                    )
                    continue
                self.step_seconds.setdefault(kind, []).extend(times)
                return times
            print(f"warning: {outcome.line(kind)} ({note})", file=sys.stderr, flush=True)
        self.failed.append(kind)
        return None


def _ratios(numerators: list[float | None], denominators: list[float | None]) -> list:
    """Per-repeat ratios: each repeat's runs ran back to back, under the same load; None where
    either run of the repeat failed."""
    return [
        n / d if n is not None and d is not None else None
        for n, d in zip(numerators, denominators, strict=True)
    ]


def steps_per_sec(step_seconds: list[float] | None, warmup: int) -> float | None:
    if step_seconds is None:
        return None
    return 1.0 / statistics.median(step_seconds[warmup:])


def _cell(values: list, with_spread: bool) -> str:
    """Median (min-max) of the repeats that ran, and how many failed."""
    ran = [v for v in values if v is not None]
    failed = len(values) - len(ran)
    if not ran:
        return "failed"
    text = f"{statistics.median(ran):.3f}"
    if with_spread:
        text += f" ({min(ran):.3f}-{max(ran):.3f})"
    return text + (f", {failed} of {len(values)} failed" if failed else "")


def _rate(value: float | None) -> str:
    return f"{value:.3f} steps/s" if value is not None else "failed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strategies", nargs="+", default=["ddp", "fsdp2"])
    parser.add_argument("--write", action="store_true", help="append to docs/BENCHMARKS.md")
    args = parser.parse_args()
    if args.warmup >= args.steps:
        parser.error(f"--warmup ({args.warmup}) must be below --steps ({args.steps})")
    rows = []
    runner = Runner(args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for strategy in args.strategies:
            rates = {"raw": [], "bare": [], "full": []}
            for rep in range(args.repeats):
                cmd, result = raw_command(strategy, args.steps, tmp / f"raw-{strategy}-{rep}.json")
                times = runner.times(f"{strategy} raw", cmd, result)
                rates["raw"].append(steps_per_sec(times, args.warmup))
                for name, cb in (("bare", False), ("full", True)):
                    run_dir = tmp / f"{strategy}-{name}-{rep}"
                    cmd, result = lightning_command(strategy, args.steps, run_dir, cb)
                    times = runner.times(f"{strategy} {name}", cmd, result)
                    rates[name].append(steps_per_sec(times, args.warmup))
                print(
                    f"{strategy} repeat {rep + 1}: "
                    + ", ".join(f"{k} {_rate(v[-1])}" for k, v in rates.items()),
                    flush=True,
                )
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
        lines.append(
            f"| {strategy} | "
            + " | ".join(_cell(v, with_spread=False) for v in rates.values())
            + " | "
            + " | ".join(_cell(r, with_spread=True) for r in ratios.values())
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
    if runner.failed:
        print(
            f"error: {len(runner.failed)} run(s) failed twice: {', '.join(runner.failed)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
