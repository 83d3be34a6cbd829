"""Goodput under failures: how much training time survives a rank dying every K steps?

    python bench/goodput.py [--steps 60] [--fail-every 20] [--checkpoint-every 10] [--repeats 5]

Runs the same 2-rank DDP job under torchrun twice per repeat, interleaved: once without
failures, and once with rank 1 SIGKILLed after every `--fail-every` optimizer steps (one kill per
torchrun attempt; `--max-restarts` covers them). Each restart resumes with `trainer.resume=auto`
from the last complete checkpoint, so the steps since it are computed again.

Reports, as medians over the repeats (with min-max):
- goodput: useful steps per second of wall time, faulty run over failure-free run;
- seconds lost per failure: (faulty wall - failure-free wall) / failures;
- of which recompute: the steps redone after each restart times the failure-free step time;
  the rest is restart and reload (process start, rendezvous, model build, checkpoint load).
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
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}


def run(steps: int, checkpoint_every: int, fail_every: int | None, run_dir: Path) -> dict:
    failures = (steps - 1) // fail_every if fail_every else 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           f"--max-restarts={failures}", str(ROOT / "tests" / "toy_train.py"),
           "strategy=ddp", "hardware.devices=2", "debug=fast", "logger=none",
           f"trainer.max_steps={steps}", f"trainer.checkpoint.every_n_train_steps={checkpoint_every}",
           "trainer.resume=auto", f"hydra.run.dir={run_dir}"]  # fmt: skip
    if fail_every:
        cmd += [
            "+callbacks.kill._target_=tests.faults.KillEvery",
            f"+callbacks.kill.every={fail_every}",
            f"+callbacks.kill.times={failures}",
        ]
    started = time.perf_counter()
    result = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode:
        raise SystemExit(f"torchrun failed:\n{(result.stdout + result.stderr)[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps, summary["steps"]
    step_seconds = statistics.median(summary["step_seconds"][1:])
    return {"wall": wall, "failures": failures, "step_seconds": step_seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--fail-every", type=int, default=20)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            free = run(args.steps, args.checkpoint_every, None, Path(tmp) / f"free{i}")
            faulty = run(args.steps, args.checkpoint_every, args.fail_every, Path(tmp) / f"f{i}")
            # The kill comes before that step's checkpoint: each restart redoes the steps since
            # the previous complete one.
            kills = [args.fail_every * (k + 1) for k in range(faulty["failures"])]
            redone = sum(
                s - (s - 1) // args.checkpoint_every * args.checkpoint_every for s in kills
            )
            lost = (faulty["wall"] - free["wall"]) / max(1, faulty["failures"])
            recompute = redone * free["step_seconds"] / max(1, faulty["failures"])
            rows.append({"goodput": free["wall"] / faulty["wall"], "lost": lost,
                         "recompute": recompute, "restart_reload": lost - recompute,
                         "free_wall": free["wall"], "faulty_wall": faulty["wall"]})  # fmt: skip
            print(f"repeat {i + 1}: failure-free {free['wall']:.1f} s, with "
                  f"{faulty['failures']} failures {faulty['wall']:.1f} s", flush=True)  # fmt: skip
    print(f"\n{args.steps} steps, a rank killed every {args.fail_every} steps, checkpoint every "
          f"{args.checkpoint_every} steps; median (min-max) over {args.repeats} repeats:")  # fmt: skip
    for key, label in (("goodput", "goodput (failure-free wall / faulty wall)"),
                       ("lost", "seconds lost per failure"),
                       ("recompute", "  of which recompute"),
                       ("restart_reload", "  of which restart + reload"),
                       ("free_wall", "failure-free wall s"), ("faulty_wall", "faulty wall s")):  # fmt: skip
        values = [r[key] for r in rows]
        print(f"  {label:44s} {statistics.median(values):8.3f}  "
              f"({min(values):.3f}-{max(values):.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
