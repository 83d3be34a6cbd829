"""Benchmark (not a test): splitting work by rank speed, with one rank simulated slower.

    python bench/slow_devices.py --repeats 5 --steps 6 [--write]

Two comparisons on 2 CPU ranks (gloo), each configuration pair interleaved in every repeat,
the ranks paced by the simulation tool (`strategy.simulate_slowdown`, `simulate_flops`, a
simulated device of 1 GFLOP/s at factor 1: cluster/simulate.py), synthetic data:

1. pipeline: `llama_debug` deepened to 8 layers (`model.n_layers=8`), pp=2, 1F1B, 8
   microbatches of 2 x 128 tokens, stage 1 simulated 3x slower: the uniform split 4/4
   (`strategy.split_points=[4]`) against the speed-balanced 7/1 (`[7]`: with the output
   projection costing about a block, stage 1's 1 block + head x 3 is closest to stage 0's 7
   blocks); and the same for the 4-layer `llama_debug`, 2/2 against 3/1;
2. DDP: `llama_debug`, rank 1 simulated 2x slower, a global batch of 12 in micro-batches of 2:
   equal shares (3 and 3 micro-batches) against `strategy.dp_shares=[2,1]` (4 and 2).

Each run's step time is the median of its steps after the first (summary.json's
`throughput.step_seconds`); printed per configuration as the median over repeats (min-max),
with the ratio balanced / uniform (and weighted / equal) repeat by repeat. The losses of the two
runs of a pair must agree (the same model and batches, only the split or shares differ): the
largest relative difference is printed. `--write` appends the table to docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired import QUIET, ROOT, interleaved, max_loss_difference, ratios, spread  # noqa: E402

SIMULATED = ["strategy.simulate_flops=1e9"]
DATA = ["data=synthetic", "data.seq_len=128"]


def pipeline_pair(layers: int, uniform: int, balanced: int) -> dict[str, list[str]]:
    # 8 microbatches: 1F1B's time is about (m - 1) x the slowest stage + every stage once, so
    # the split's gain shows more of its steady state than at the default 2 x pp = 4.
    base = ["model=llama_debug", f"model.n_layers={layers}", *DATA, "data.global_batch_size=16",
            "strategy=pp", "hardware.devices=2", "strategy.schedule=1F1B",
            "strategy.microbatches=8",
            "strategy.simulate_slowdown=[1,3]", *SIMULATED]  # fmt: skip
    return {
        f"pp {layers} layers {uniform}/{layers - uniform}": [
            *base,
            f"strategy.split_points=[{uniform}]",
        ],
        f"pp {layers} layers {balanced}/{layers - balanced}": [
            *base,
            f"strategy.split_points=[{balanced}]",
        ],
    }


def ddp_pair() -> dict[str, list[str]]:
    base = [
        "model=llama_debug",
        *DATA,
        "data.global_batch_size=12",
        "data.per_rank_batch_size=2",
        "strategy=ddp",
        "hardware.devices=2",
        "strategy.simulate_slowdown={1:2}",
        *SIMULATED,
    ]
    return {"ddp equal shares": base, "ddp dp_shares=[2,1]": [*base, "strategy.dp_shares=[2,1]"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--only", choices=["pp8", "pp4", "ddp"], action="append")
    parser.add_argument("--write", action="store_true", help="append to docs/BENCHMARKS.md")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    args = parser.parse_args()
    pairs = {"pp8": pipeline_pair(8, 4, 7), "pp4": pipeline_pair(4, 2, 3), "ddp": ddp_pair()}
    rows, raw = [], {}
    for key in args.only or list(pairs):
        configs = {
            n: [*o, *QUIET, f"trainer.max_steps={args.steps}"] for n, o in pairs[key].items()
        }
        print(f"{key}: {' against '.join(configs)}", flush=True)
        runs = interleaved(
            configs, args.repeats, lambda s: f"{s['throughput']['step_seconds']:.3f} s/step"
        )
        (first, second), seconds = list(configs), {}
        for name in configs:
            seconds[name] = [s["throughput"]["step_seconds"] for s in runs[name]]
        ratio = ratios(seconds[second], seconds[first])
        loss_gap = max(
            max_loss_difference(a, b) for a, b in zip(runs[first], runs[second], strict=True)
        )
        rows.append(
            (
                first,
                spread(seconds[first]),
                second,
                spread(seconds[second]),
                spread(ratio),
                f"{loss_gap:.1e}",
            )
        )
        raw[key] = {"seconds": seconds, "ratio": ratio, "max_loss_difference": loss_gap}
    header = (
        "| uniform / equal | step s | speed-aware | step s | speed-aware / uniform "
        "| max loss difference |\n| --- | --- | --- | --- | --- | --- |"
    )
    table = "\n".join([header, *("| " + " | ".join(r) + " |" for r in rows)])
    print(table)
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))
    if args.write:
        day = datetime.date.today().isoformat()
        text = (
            f"\n## Ranks of unequal speed (bench/slow_devices.py, {day})\n\n"
            f"Machine: {platform.machine()}, 2 CPU cores shared with other work, 2 gloo ranks. "
            f"Command: `python bench/slow_devices.py --repeats {args.repeats} --steps "
            f"{args.steps}`. Median step seconds over the repeats (min-max); ratios repeat "
            f"by repeat.\n\n{table}\n"
        )
        with (ROOT / "docs" / "BENCHMARKS.md").open("a") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
