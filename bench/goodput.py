"""Goodput under failures: restart from a checkpoint against live healing.

    python bench/goodput.py [--steps 60] [--fail-at 30] [--checkpoint-every 10] \\
        [--step-sleep 0.5] [--repeats 5] [--modes restart,live]

Each repeat runs, interleaved, a failure-free and a faulty job of each mode; each job trains
`--steps` steps of `debug=fast` on 2 ranks, every step slowed by `--step-sleep` seconds on
rank 0 (a stand-in for a real step's compute, so that a restarted part has steps to come back
to), and the faulty job loses one rank at step `--fail-at`:

- restart: 2-rank DDP under torchrun; rank 1 is SIGKILLed after step `--fail-at`, torchrun
  restarts every rank, and they resume with `trainer.resume=auto` from the last checkpoint
  (one every `--checkpoint-every` steps), redoing the steps since it;
- live: `strategy=ft_hsdp`, 2 replica groups of 1 rank (`python -m lightning_dist.launch
  replicas`); group 1's rank is SIGKILLed in step `--fail-at` between its forward and its
  backward; group 0 reruns that step alone and trains on, group 1 is relaunched and heals.

Reports, as medians over the repeats (with min-max), for each mode:
- goodput: failure-free wall / faulty wall (the job ends when its last process does);
- seconds lost per failure: faulty wall - failure-free wall;
- sample goodput: the share of the global batches' samples trained on (live: a step without
  group 1 trains on half of its batch; restart: every step counts once, on every sample).
Fault injection comes from tests/faults.py through tests/toy_train.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "WANDB_MODE": "offline",
    "LIGHTNING_DIST_ALLOW_TARGETS": "tests.",
}
SCRIPT = str(ROOT / "tests" / "toy_train.py")


def _common(args: argparse.Namespace) -> list[str]:
    return ["debug=fast", "logger=none", f"trainer.max_steps={args.steps}",
            "trainer.collective_timeout_s=20", "+callbacks.slow._target_=tests.slow_rank.SlowRank",
            "+callbacks.slow.rank=0", f"+callbacks.slow.seconds={args.step_sleep}"]  # fmt: skip


def restart_job(args: argparse.Namespace, faulty: bool, run_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           f"--max-restarts={int(faulty)}", SCRIPT, "strategy=ddp", "hardware.devices=2",
           *_common(args), f"trainer.checkpoint.every_n_train_steps={args.checkpoint_every}",
           "trainer.resume=auto", f"hydra.run.dir={run_dir}"]  # fmt: skip
    if faulty:
        cmd += [
            "+callbacks.kill._target_=tests.faults.KillEvery",
            f"+callbacks.kill.every={args.fail_at}",
            "+callbacks.kill.times=1",
        ]
    return cmd


def live_job(args: argparse.Namespace, faulty: bool, run_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "lightning_dist.launch", "replicas", "--groups", "2",
           "--nproc-per-group", "1", f"--max-restarts={int(faulty)}", "--script", SCRIPT,
           *_common(args), f"hydra.run.dir={run_dir}"]  # fmt: skip
    if faulty:
        cmd += ["+callbacks.kill._target_=tests.faults.KillInReplicaGroup",
                f"+callbacks.kill.step={args.fail_at}", "+callbacks.kill.group=1",
                "+callbacks.kill.rank=0"]  # fmt: skip
    return cmd


def run(mode: str, args: argparse.Namespace, faulty: bool, run_dir: Path) -> dict:
    cmd = (live_job if mode == "live" else restart_job)(args, faulty, run_dir)
    started = time.perf_counter()
    result = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode:
        raise SystemExit(f"{mode} job failed:\n{(result.stdout + result.stderr)[-3000:]}")
    summary = json.loads(
        ((run_dir / "group0") if mode == "live" else run_dir).joinpath("summary.json").read_text()
    )
    assert summary["steps"] == args.steps, summary["steps"]
    groups = summary.get("replica_groups_per_step")
    samples = sum(groups) / (2 * len(groups)) if groups else 1.0
    return {"wall": wall, "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--fail-at", type=int, default=30)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-sleep", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", default="restart,live")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if not set(modes) <= {"restart", "live"} or not 0 < args.fail_at < args.steps:
        raise SystemExit("--modes takes restart and/or live; --fail-at must be inside --steps")
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for mode in modes:
                free = run(mode, args, False, Path(tmp) / f"{mode}-free{i}")
                faulty = run(mode, args, True, Path(tmp) / f"{mode}-faulty{i}")
                rows[mode].append(
                    {
                        "goodput": free["wall"] / faulty["wall"],
                        "lost": faulty["wall"] - free["wall"],
                        "samples": faulty["samples"],
                        "free_wall": free["wall"],
                        "faulty_wall": faulty["wall"],
                    }
                )
                print(
                    f"repeat {i + 1} {mode}: failure-free {free['wall']:.1f} s, with one "
                    f"failure {faulty['wall']:.1f} s",
                    flush=True,
                )
    print(
        f"\n{args.steps} steps of {args.step_sleep} s + compute, one rank killed at step "
        f"{args.fail_at}; restart: checkpoint every {args.checkpoint_every} steps; median "
        f"(min-max) over {args.repeats} repeats:"
    )
    labels = (("goodput", "goodput (failure-free wall / faulty wall)"),
              ("lost", "seconds lost per failure"), ("samples", "sample goodput"),
              ("free_wall", "failure-free wall s"), ("faulty_wall", "faulty wall s"))  # fmt: skip
    for mode in modes:
        print(f"  {mode}")
        for key, label in labels:
            values = [r[key] for r in rows[mode]]
            print(
                f"    {label:44s} {statistics.median(values):8.3f}  "
                f"({min(values):.3f}-{max(values):.3f})"
            )


if __name__ == "__main__":
    main()
