"""What does a checkpoint cost the training step, written synchronously or in the background?

    python bench/checkpoint_cost.py [--steps 30] [--every 5] [--repeats 5]

Runs FSDP2 on 2 CPU ranks (gloo), `model=tiny` on synthetic data, saving a sharded checkpoint
every `--every` steps, with `trainer.checkpoint.async_save` off and on, interleaved `--repeats`
times. A save runs at the end of step k, so its cost lands in the time of step k+1 on the
shared step clock. Prints, as medians over repeats (min-max): the median time of a step that
follows a save, of a step that does not, and their difference: the step-time cost of one save.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
COMMON = ["strategy=fsdp2", "hardware.devices=2", "model=tiny", "data=synthetic",
          "data.seq_len=128", "data.global_batch_size=8", "logger=none", "callbacks=none",
          "trainer.val_check_interval=null"]  # fmt: skip


def run(steps: int, every: int, asynchronous: bool, run_dir: Path) -> tuple[float, float]:
    cmd = [sys.executable, str(ROOT / "train.py"), *COMMON, f"trainer.max_steps={steps}",
           f"trainer.checkpoint.every_n_train_steps={every}",
           f"trainer.checkpoint.async_save={str(asynchronous).lower()}",
           f"hydra.run.dir={run_dir}"]  # fmt: skip
    result = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"train.py failed:\n{(result.stdout + result.stderr)[-3000:]}")
    seconds = json.loads((run_dir / "summary.json").read_text())["step_seconds"]
    # seconds[i] is step i + 1; a save at the end of step k (k % every == 0) slows step k + 1.
    after_save = [s for i, s in enumerate(seconds) if i > 0 and i % every == 0]
    plain = [s for i, s in enumerate(seconds) if i > 1 and i % every != 0]
    return statistics.median(after_save), statistics.median(plain)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for mode in results:
                run_dir = Path(tmp) / f"{mode}{i}"
                results[mode].append(run(args.steps, args.every, mode == "async", run_dir))
            print(f"repeat {i + 1} done", flush=True)
    print(
        f"\nFSDP2, 2 CPU ranks, model=tiny, a sharded checkpoint every {args.every} steps; "
        f"median (min-max) over {args.repeats} repeats, seconds:"
    )
    print("| save | step after a save | other steps | cost of one save |")
    print("| --- | --- | --- | --- |")
    for mode, rows in results.items():
        cells = []
        for values in ([a for a, _ in rows], [p for _, p in rows], [a - p for a, p in rows]):
            cells.append(f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})")
        print(f"| {mode} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
