"""Benchmark of the FSDP knobs (not a test): memory by category per rank and median step time.

    python bench/fsdp_knobs.py                        # 4 gloo ranks on this CPU, model=tiny
    python bench/fsdp_knobs.py hardware=gpu model=llama3_1b --devices 8

Every row trains the same model on the same global batch through `train.py`, so the rows differ
only in the strategy's settings. Memory comes from summary.json's `memory_by_category` (torch's
MemTracker around step 2, model state counted from the tensors) and `peak_memory_bytes` (the
CUDA allocator's peak on GPUs, the process's peak RSS on CPUs). The table is printed and written
to docs/FSDP_KNOBS.md.
"""

from __future__ import annotations

import argparse
import platform
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lightning_dist.run.parity_runs import run_train  # noqa: E402

TUNED = ["strategy=fsdp"]
ROWS = {
    # Lightning's FSDPStrategy defaults: FULL_SHARD, the whole model as one FSDP unit, no
    # forward prefetch. Run through our class, since stock Lightning cannot start FSDP on a CPU.
    "Lightning FSDPStrategy defaults": [
        *TUNED, "strategy.sharding_strategy=FULL_SHARD", "strategy.auto_wrap=[]",
        "strategy.forward_prefetch=false",
    ],
    "tuned (SHARD_GRAD_OP, prefetch, limit_all_gathers)": TUNED,
    "tuned FULL_SHARD": [*TUNED, "strategy.sharding_strategy=FULL_SHARD"],
    "tuned HYBRID_SHARD (shard in halves)": [*TUNED, "strategy.sharding_strategy=HYBRID_SHARD"],
    "tuned _HYBRID_SHARD_ZERO2": [*TUNED, "strategy.sharding_strategy=_HYBRID_SHARD_ZERO2"],
    "tuned NO_SHARD": [*TUNED, "strategy.sharding_strategy=NO_SHARD"],
    "tuned, prefetch off": [*TUNED, "strategy.forward_prefetch=false", "strategy.backward_prefetch=none"],
    "tuned, limit_all_gathers off": [*TUNED, "strategy.limit_all_gathers=false"],
    "fsdp2 reshard_after_forward=true": ["strategy=fsdp2"],
    "fsdp2 reshard_after_forward=false": ["strategy=fsdp2", "strategy.reshard_after_forward=false"],
    "DDP (reference)": ["strategy=ddp"],
}  # fmt: skip
COLUMNS = ("params", "grads", "optimizer", "activations", "temps", "total")


CPU_CAVEAT = (
    "**What these CPU numbers can and cannot show.** The memory columns carry over to a "
    "GPU: they are counted tensor by tensor, so for the same dtype they show what each "
    "knob keeps (SHARD_GRAD_OP holds the gathered parameters until backward, HYBRID_SHARD "
    "doubles the model state, NO_SHARD and DDP keep all of it). The step times do not: "
    "four gloo processes share two cores, gloo's collectives run on CPU threads that "
    "compete with the computation, and nothing overlaps. The knobs of the tuned recipe "
    "exist to hide communication under compute on a GPU (SHARD_GRAD_OP saves the backward "
    "all-gather, prefetch issues the next gather early, limit_all_gathers bounds the "
    "memory it takes), so here they can only cost, and single 12-step timings on a shared "
    "machine vary by tens of percent. That the tuned row is slower than Lightning's "
    "defaults and than DDP on this CPU says nothing about their order on GPUs; no GPU has "
    "run this table yet (`python bench/gpu.py` is the command for one).\n\n"
)
"""Leads the page: how to read it."""


def run_row(
    name: str, overrides: list[str], common: list[str], devices: int, workdir: Path
) -> dict:
    extra = []
    if "HYBRID" in name:
        extra = [f"strategy.hybrid_shard_size={max(devices // 2, 1)}"]
    run_dir = workdir / re.sub(r"[^A-Za-z0-9]+", "_", name)  # Hydra parses the path
    return run_train([*common, *overrides, *extra], run_dir, timeout=3600)


def step_seconds(summary: dict) -> float | None:
    """Median step time after the first step, the statistic behind summary.json's tokens/s."""
    tps = summary.get("tokens_per_sec")
    return summary["global_batch_size"] * summary["seq_len"] / tps if tps else None


def mib(value: float) -> str:
    return f"{value / 2**20:.2f}"


def table(results: dict[str, dict]) -> str:
    head = [
        "configuration",
        "layout (rep x shard)",
        *COLUMNS,
        "model state",
        "peak per rank (allocator/RSS)",
        "median step s",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in results.items():
        worst = {k: max(m[k] for m in s["memory_by_category"] if m) for k in COLUMNS}
        state = max(m["params"] + m["grads"] + m["optimizer"] for m in s["memory_by_category"] if m)
        peaks = "/".join(mib(p) for p in s["peak_memory_bytes"])
        seconds = step_seconds(s)
        layout = f"{s['layout']['dp_replicate']} x {s['layout']['dp_shard']}"
        cells = [
            name,
            layout,
            *(mib(worst[k]) for k in COLUMNS),
            mib(state),
            peaks,
            f"{seconds:.3f}" if seconds else "n/a",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="extra train.py overrides (hardware=gpu ...)")
    parser.add_argument("--devices", type=int, default=4, help="ranks per run (default 4)")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    parser.add_argument("--only", nargs="*", help="run only rows whose name contains one of these")
    parser.add_argument("--out", default=str(REPO / "docs" / "FSDP_KNOBS.md"))
    args = parser.parse_args(argv)
    common = ["model=tiny", "data=synthetic", "logger=none", "trainer.val_check_interval=null",
              f"trainer.max_steps={args.steps}", f"hardware.devices={args.devices}",
              *args.overrides]  # fmt: skip
    rows = {k: v for k, v in ROWS.items() if not args.only or any(o in k for o in args.only)}
    results = {}
    with tempfile.TemporaryDirectory(prefix="fsdp-knobs-") as tmp:
        for name, overrides in rows.items():
            print(f"running: {name}", flush=True)
            results[name] = run_row(name, overrides, common, args.devices, Path(tmp))
    text = table(results)
    print(text)
    first = next(iter(results.values()))
    header = (
        "# FSDP knobs: memory by category and step time\n\n"
        + CPU_CAVEAT
        + f"Written by `{' '.join(['python bench/fsdp_knobs.py', *(argv or sys.argv[1:])])}`: "
        f"{first['world_size']} ranks on {first['hardware']} ({platform.processor() or platform.machine()}), "
        f"model={first['model']}, precision {first['precision']}, global batch "
        f"{first['global_batch_size']} x {first['seq_len']} tokens, {args.steps} steps.\n\n"
        "Memory in MiB per rank (the largest rank shown): model state (params, grads, optimizer) is "
        "what persists between steps; activations are their high-water mark during step 2; temps "
        "are the rest of that step's peak (gathered parameters, communication buffers, "
        "temporaries); total is the step's tracked peak. The allocator column is the CUDA "
        "allocator's peak on GPUs and the whole process's peak RSS on CPUs (Python, torch and "
        "gloo included). Step times on a shared 2-core CPU are only indicative; on CPUs gloo "
        "does not overlap communication with compute, so the prefetch knobs cannot pay off "
        "there. The first row is Lightning's FSDPStrategy defaults (FULL_SHARD, the whole model "
        "as one FSDP unit, no forward prefetch) run through TunedFSDPStrategy, because stock "
        "Lightning cannot start FSDP on a CPU.\n\n"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(header + text + "\n")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
