"""Benchmark (not a test): DiLoCo and compressed gradients over a slow link, and what they cost
in loss.

    python bench/diloco.py --repeats 5 --cycles 4 --loss-steps 400 [--out DIR] [--write]

`model=llama_debug` on the default text task (data=text: the standard library's .py files,
byte-level), 2 CPU replicas (gloo), a global batch of 8 windows of 32 tokens, so a step
computes in about 35 ms (of which the model's forward, backward and AdamW are about half) and
the link dominates:

1. throughput: plain DDP against DiLoCo (`strategy.diloco_inner_steps=8`), both with a
   simulated 200 ms delay on each gradient all-reduce (`strategy.simulate_delay_ms=200`: DDP's
   bucket, DiLoCo's outer all-reduce; the step's loss all-reduce is not delayed), interleaved
   `--repeats` times. Tokens/s is tokens over the time of whole DiLoCo cycles (steps 2 to
   1 + 8 x cycles, the mean step, not the median: the median would leave DiLoCo's sync steps
   out);
2. loss: `--loss-steps` steps each of DDP without delay (the reference), DiLoCo (H = 8; its
   losses do not depend on the delay) with its paper's outer step (lr 0.7, Nesterov 0.9) and
   with outer lr 1 and no momentum (LocalSGD), and DDP with bf16, fp16 and PowerSGD (rank 2)
   gradients, each at 3 seeds: the validation loss after the last step (the same held-out
   windows, the same tokens trained on), the mean train loss of the last 20 steps, and each
   one's gap to DDP's of the same seed. The curves of the first seed against tokens go to
   DIR/loss_curves.png (`lightning_dist.report`), the tables to DIR/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired import QUIET, ROOT, interleaved, ratios, spread, train  # noqa: E402

H = 8
DELAY_MS = 200
BASE = [
    "model=llama_debug",
    "data=text",
    "data.seq_len=32",
    "data.global_batch_size=8",
    "strategy=ddp",
    "hardware.devices=2",
]
LOSS_RUNS = {
    "ddp": [],
    f"diloco H={H}": [f"strategy.diloco_inner_steps={H}"],
    f"diloco H={H}, outer lr 1, no momentum (LocalSGD)": [
        f"strategy.diloco_inner_steps={H}", "strategy.diloco_outer_lr=1.0",
        "strategy.diloco_outer_momentum=0",
    ],
    "ddp bf16": ["strategy.grad_compression=bf16"],
    "ddp fp16": ["strategy.grad_compression=fp16"],
    "ddp powersgd r2": ["strategy.grad_compression=powersgd", "strategy.powersgd_rank=2"],
}  # fmt: skip
SEEDS = (1234, 7, 42)
"""The loss runs' seeds (1234 is train.py's default): the gaps between runs are of the order
of the differences between seeds at 400 steps, so each is given for every seed."""


def cycle_tokens_per_sec(summary: dict, cycles: int) -> float:
    """Tokens per second over steps 2 .. 1 + H x cycles (whole cycles: H - 1 inner steps and a
    sync step each)."""
    seconds = summary["step_seconds"][1 : 1 + H * cycles]
    tokens = summary["global_batch_size"] * summary["seq_len"] * len(seconds)
    return tokens / sum(seconds)


def throughput(repeats: int, cycles: int) -> tuple[dict[str, list[float]], list[float]]:
    steps = 1 + H * cycles
    # The default callbacks but the comm monitor: callbacks=none would put Lightning's own
    # progress bar, which redraws every step, in place of ours (every 10 steps).
    delay = [f"strategy.simulate_delay_ms={DELAY_MS}", f"trainer.max_steps={steps}", *QUIET]
    configs = {
        f"ddp, {DELAY_MS} ms": [*BASE, *delay],
        f"diloco H={H}, {DELAY_MS} ms": [*BASE, *delay, f"strategy.diloco_inner_steps={H}"],
    }
    runs = interleaved(configs, repeats, lambda s: f"{cycle_tokens_per_sec(s, cycles):,.0f} tok/s")
    rates = {name: [cycle_tokens_per_sec(s, cycles) for s in runs[name]] for name in configs}
    ddp, diloco = list(configs)
    return rates, ratios(rates[diloco], rates[ddp])


def losses(steps: int, out: Path, seeds: tuple[int, ...]) -> tuple[dict, list[tuple]]:
    """Each loss run at each seed; rows of the validation and train loss gaps to DDP's (of the
    same seed), as the mean over seeds (min-max)."""
    runs: dict[str, dict[int, dict]] = {name: {} for name in LOSS_RUNS}
    quiet = ["~callbacks.comm", "trainer.memory_by_category_step=0", "logger=none"]
    with tempfile.TemporaryDirectory(prefix="bench-diloco-") as tmp:
        for seed in seeds:
            for name, extra in LOSS_RUNS.items():
                overrides = [
                    *BASE,
                    *extra,
                    *quiet,
                    f"trainer.max_steps={steps}",
                    f"trainer.val_check_interval={steps}",
                    f"seed={seed}",
                ]
                folder = "".join(c if c.isalnum() else "_" for c in f"{name}_{seed}")
                runs[name][seed] = train(overrides, Path(tmp) / folder)  # Hydra reads the path
                print(
                    f"  seed {seed} {name}: validation loss "
                    f"{runs[name][seed]['final_val_loss']:.4f}",
                    flush=True,
                )

    def gaps(name: str, value) -> str:
        rel = [value(runs[name][s]) / value(runs["ddp"][s]) - 1 for s in seeds]
        return f"{statistics.mean(rel):+.2%} ({min(rel):+.2%} to {max(rel):+.2%})"

    def val(s: dict) -> float:
        return s["final_val_loss"]

    def last20(s: dict) -> float:
        return statistics.mean(s["losses"][-20:])

    rows = []
    for name in LOSS_RUNS:
        per_seed = [runs[name][s] for s in seeds]
        rows.append(
            (
                name,
                " / ".join(f"{val(s):.4f}" for s in per_seed),
                gaps(name, val),
                gaps(name, last20),
                f"{statistics.median(s['tokens_per_sec'] for s in per_seed):,.0f}",
            )
        )
    from lightning_dist.run.report_pages import write_loss_comparison

    first = seeds[0]
    write_loss_comparison(
        {n: runs[n][first] for n in LOSS_RUNS},
        out / "loss_curves.png",
        f"llama_debug, stdlib text, 2 replicas, seed {first}",
    )
    return runs, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=4, help="DiLoCo cycles timed per run")
    parser.add_argument("--loss-steps", type=int, default=400)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "diloco")
    parser.add_argument("--skip", choices=["throughput", "loss"], action="append", default=[])
    parser.add_argument("--write", action="store_true", help="append to docs/BENCHMARKS.md")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    text = [f"Machine: {platform.machine()}, 2 CPU cores shared with other work, 2 gloo ranks. "
            f"Command: `python bench/diloco.py --repeats {args.repeats} --cycles {args.cycles} "
            f"--loss-steps {args.loss_steps}`; `{' '.join(BASE)}`.", ""]  # fmt: skip
    record: dict = {}
    if "throughput" not in args.skip:
        print(f"throughput, {DELAY_MS} ms per gradient all-reduce:", flush=True)
        rates, ratio = throughput(args.repeats, args.cycles)
        record["tokens_per_sec"], record["ratio"] = rates, ratio
        text += ["| run | tokens/s, median (min-max) |", "| --- | --- |",
                 *(f"| {n} | {spread(v)} |" for n, v in rates.items()),
                 f"| DiLoCo / DDP, repeat by repeat | {spread(ratio)} |", ""]  # fmt: skip
    if "loss" not in args.skip:
        print(f"loss after {args.loss_steps} steps:", flush=True)
        runs, rows = losses(args.loss_steps, args.out, SEEDS)
        record["losses"] = {
            n: {
                str(seed): {"losses": s["losses"], "val_losses": s["val_losses"]}
                for seed, s in by_seed.items()
            }
            for n, by_seed in runs.items()
        }
        text += [f"Loss after {args.loss_steps} steps ({args.loss_steps * 8 * 32:,} tokens), no "
                 f"delay, seeds {', '.join(map(str, SEEDS))}; gaps to DDP of the same seed, mean "
                 f"(min to max); curves of seed {SEEDS[0]}: loss_curves.png.", "",
                 "| run | validation loss by seed | vs ddp | train loss, last 20 steps, vs ddp "
                 "| tokens/s (no delay, median) |", "| --- | --- | --- | --- | --- |",
                 *("| " + " | ".join(r) + " |" for r in rows), ""]  # fmt: skip
    report = "\n".join(text)
    print(report)
    (args.out / "README.md").write_text(report + "\n")
    (args.out / "diloco.json").write_text(json.dumps(record, indent=1))
    if args.write:
        day = datetime.date.today().isoformat()
        with (ROOT / "docs" / "BENCHMARKS.md").open("a") as f:
            f.write(f"\n## DiLoCo and gradient compression (bench/diloco.py, {day})\n\n{report}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
