"""Per-stage peak memory of a pipeline step, torch's `PipelineStage` against ours, and the planner.

    python bench/pipeline_memory.py [--json out.json]

Runs `tests/dist/pipeline_memory_cases.py` under torchrun on 2 and on 4 gloo ranks (about a
minute and a half on 2 cores): a llama_debug-shaped model with 8 layers, 8 microbatches of
2 x 128 tokens, 1F1B and Interleaved1F1B (2 virtual stages), each with torch's own stage
("before": every microbatch's receive buffers kept for good, the multi-stage schedule's sends
held to the step's end) and with `InFlightStage` ("after"). Per pipeline rank it prints the
step's peak of live tensors (MemTracker), the part beyond the model state, the in-flight bound
and the planner's peak (`planner.memory.stage_memories`, its tensors: no optimizer state is
measured here, the step stops before `optimizer.step()`).

The bound is n x (one microbatch's peak through this rank's stages alone, measured) + c x R:
n = `inflight_microbatches` (whole-stage units), c = the chunk-microbatches in flight (n x
virtual stages) and R one receive buffer (micro-batch x seq x dim x 4 bytes). Exits 1 if an
"after" row is above 1.10 x its bound, or the planner is more than 5% off an "after" row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lightning_dist.layout import Layout  # noqa: E402
from lightning_dist.models.args import ModelArgs  # noqa: E402
from lightning_dist.planner.memory import inflight_microbatches, stage_memories  # noqa: E402
from lightning_dist.planner.settings import TrainSettings  # noqa: E402
from tests.dist.pipeline_memory_cases import (  # noqa: E402
    MICRO_BATCH_SIZE,
    MICROBATCHES,
    MODEL,
    SEQ,
)

MAX_OVER_BOUND = 1.10
MAX_PLANNER_ERROR = 0.05
PIPELINE_DEGREES = (2, 4)


def layout_of(row: dict) -> Layout:
    return Layout(
        pp=row["pp"], schedule=row["schedule"], virtual_stages=row["virtual_stages"],
        microbatches=MICROBATCHES,
    ).resolve(row["pp"])  # fmt: skip


def settings() -> TrainSettings:
    """The measured run for the planner: fp32 on a CPU, one data-parallel rank, SGD (the
    measured step has no optimizer state)."""
    return TrainSettings.of(
        global_batch_size=MICROBATCHES * MICRO_BATCH_SIZE, seq_len=SEQ,
        micro_batch_size=MICRO_BATCH_SIZE, precision="32-true", optimizer="sgd",
        sharding="NO_SHARD", accelerator="cpu",
    )  # fmt: skip


def counted(row: dict) -> dict:
    """`row` with the in-flight bound and the planner's peak added."""
    layout = layout_of(row)
    inflight = inflight_microbatches(layout, row["rank"], MICROBATCHES)
    receive = MICRO_BATCH_SIZE * SEQ * MODEL["dim"] * 4
    bound = inflight * row["one_microbatch"] + inflight * layout.virtual_stages * receive
    planned = stage_memories(ModelArgs(**MODEL), layout, settings())[row["rank"]]
    planner = planned.params + planned.grads + planned.activations + planned.buffers
    return {**row, "inflight": inflight, "bound": row["model_state"] + bound,
            "over_bound": row["step"] / bound, "planner": planner,
            "planner_error": planner / row["peak"] - 1}  # fmt: skip


def failures(rows: list[dict]) -> list[str]:
    """What breaks the targets ("after" rows), one line each."""
    out = []
    for r in rows:
        if not r["release"]:
            continue
        name = f"pp{r['pp']} {r['schedule']} rank {r['rank']}"
        if r["over_bound"] > MAX_OVER_BOUND:
            out.append(f"{name}: {r['over_bound']:.3f} x the in-flight bound")
        if abs(r["planner_error"]) > MAX_PLANNER_ERROR:
            out.append(f"{name}: the planner is {r['planner_error']:+.1%} off")
    return out


def render(rows: list[dict]) -> str:
    mib = 2**20
    lines = [
        "| pp | schedule | rank | in flight | before MiB | after MiB | beyond model state, "
        "before / after MiB | / bound, before / after | planner MiB | planner error |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    before = {(r["pp"], r["schedule"], r["rank"]): r for r in rows if not r["release"]}
    after = sorted(
        (r for r in rows if r["release"]), key=lambda r: (r["pp"], r["schedule"], r["rank"])
    )
    for r in after:
        old = before[r["pp"], r["schedule"], r["rank"]]
        lines.append(
            f"| {r['pp']} | {r['schedule']} | {r['rank']} | {r['inflight']:g} "
            f"| {old['peak'] / mib:.2f} | {r['peak'] / mib:.2f} "
            f"| {old['step'] / mib:.2f} / {r['step'] / mib:.2f} "
            f"| {old['over_bound']:.3f} / {r['over_bound']:.3f} "
            f"| {r['planner'] / mib:.2f} | {r['planner_error']:+.1%} |"
        )
    return "\n".join(lines)


def measure(pp: int, out: Path) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    script = ROOT / "tests" / "dist" / "pipeline_memory_cases.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={pp}", str(script), str(out)]  # fmt: skip
    print(f"measuring pp={pp} ...", flush=True)
    subprocess.run(cmd, check=True, env=env, timeout=600, capture_output=True)
    return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for pp in PIPELINE_DEGREES:
            rows += measure(pp, Path(tmp) / f"pp{pp}.json")
    rows = [counted(r) for r in rows]
    print(
        f"peak of live tensors per pipeline rank, {MICROBATCHES} microbatches of "
        f"{MICRO_BATCH_SIZE} x {SEQ} tokens (MemTracker, one step, no optimizer step)\n"
        + render(rows)
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    bad = failures(rows)
    for line in bad:
        print("FAIL", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
