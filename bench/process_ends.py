"""Does every process end? Runs short 2-rank jobs many times and counts hangs, aborts, other
failures and processes left behind.

    python bench/process_ends.py [--runs 50] [--kinds raw-ddp raw-fsdp2 train]

The kinds, interleaved run by run so that load and drift hit them alike:

- raw-ddp, raw-fsdp2: `torchrun --standalone --nproc_per_node 2 bench/raw_loop.py --strategy
  ddp|fsdp2 --steps 30` (the hand-written loop of bench/overhead.py; `--steps` changes 30);
- train: `python train.py debug=fast hardware.devices=2` (Lightning's launcher, 2 gloo ranks).

Each run is bounded by bench/bounded.py (startup plus 10x the median step time of the kind's
earlier runs); a hang is killed with every process it started. Prints one line per run that
did not end well, then a table; exits 1 if any run hung, aborted, failed or left a process
behind. tests/cluster/test_process_ends.py runs a short form of it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bounded import run_bounded, timeout_for

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
KINDS = ("raw-ddp", "raw-fsdp2", "train")
STEPS = 30


def command(kind: str, out: Path, steps: int = STEPS) -> list[str]:
    if kind == "train":
        return [
            sys.executable,
            str(ROOT / "train.py"),
            "debug=fast",
            "hardware.devices=2",
            "logger=none",
            f"hydra.run.dir={out}",
        ]
    strategy = kind.split("-", 1)[1]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            "2", str(ROOT / "bench" / "raw_loop.py"), "--strategy", strategy, "--steps",
            str(steps), "--out", str(out / "times.json")]  # fmt: skip


def step_seconds(kind: str, out: Path) -> list[float]:
    path = out / ("summary.json" if kind == "train" else "times.json")
    try:
        return json.loads(path.read_text())["step_seconds"]
    except (OSError, ValueError, KeyError):
        return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python bench/process_ends.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--runs", type=int, default=50, help="runs of each kind (default 50)")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument(
        "--steps", type=int, default=STEPS, help=f"steps of each raw loop (default {STEPS})"
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.steps < 1:
        parser.error(f"--runs and --steps must be at least 1, not {args.runs} and {args.steps}")
    counts = {
        k: {"ok": 0, "hang": 0, "abort": 0, "failed": 0, "left behind": 0} for k in args.kinds
    }
    walls: dict[str, list[float]] = {k: [] for k in args.kinds}
    steps: dict[str, list[float]] = {k: [] for k in args.kinds}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="process-ends-") as tmp:
        for i in range(args.runs):
            for kind in args.kinds:
                out = Path(tmp) / f"{kind}-{i}"
                out.mkdir()
                n_steps = 12 if kind == "train" else args.steps  # debug=fast trains 12 steps
                bound = timeout_for(n_steps, steps[kind])
                outcome = run_bounded(
                    command(kind, out, args.steps), timeout_s=bound, env=ENV, cwd=ROOT
                )
                counts[kind][outcome.status] += 1
                counts[kind]["left behind"] += outcome.left_behind > 0
                if outcome.status == "ok":
                    walls[kind].append(outcome.seconds)
                    steps[kind] += step_seconds(kind, out)
                if outcome.status != "ok" or outcome.left_behind:
                    print(outcome.line(f"run {i + 1} of {kind}"), flush=True)
            done = (i + 1) * len(args.kinds)
            print(
                f"[{done}/{args.runs * len(args.kinds)} runs, {time.monotonic() - started:.0f} s]",
                flush=True,
            )
    print(
        "| kind | runs | ok | hangs | aborts | other failures | left processes behind | "
        "median wall s (min-max) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    bad = 0
    for kind in args.kinds:
        c, w = counts[kind], walls[kind]
        spread = f"{statistics.median(w):.1f} ({min(w):.1f}-{max(w):.1f})" if w else "-"
        print(
            f"| {kind} | {args.runs} | {c['ok']} | {c['hang']} | {c['abort']} | {c['failed']} "
            f"| {c['left behind']} | {spread} |"
        )
        bad += c["hang"] + c["abort"] + c["failed"] + c["left behind"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
