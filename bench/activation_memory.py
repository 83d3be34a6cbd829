"""Activation memory per token and block: measured against the analytic count and the planner.

    python bench/activation_memory.py [--json out.json]

Runs `tests/dist/actmem_ranks.py` on 2 gloo ranks (torchrun, about half a minute on 2 cores): with
torch's MemTracker it measures the activations of one training step of llama_debug-shaped
models (d = 64, h = 128, 4 heads, 2 kv heads, 4 x 128 tokens) with 4 and 2 blocks; their
difference over 2 blocks and the tokens is the bytes per token and block. Rows: one process and
tp = 2 with sequence parallelism, 32-true and bf16-mixed, no / op / full checkpointing. Each row
prints the measurement, the analytic count (`planner.activations.analytic_checkpointed_layer_bytes`,
derived in docs/PLANNER.md), the planner's count (`checkpointed_layer_bytes`) and their ratios.
Under bf16-mixed the bf16 weight copies autocast keeps are taken out of the measurement (the
planner counts them as buffers). Exits 1 if a row is above 1.10 x the analytic count, the
planner is more than 5% off, or op does not keep less than no checkpointing.
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

from lightning_dist.planner.activations import (  # noqa: E402
    analytic_checkpointed_layer_bytes,
    checkpointed_layer_bytes,
)
from lightning_dist.planner.settings import TrainSettings  # noqa: E402

MAX_OVER_ANALYTIC = 1.10
MAX_PLANNER_ERROR = 0.05
NAMES = {0: "none", "op": "op", "full": "full"}


def counted(row: dict, model, batch: int, seq: int) -> dict:
    """`row` with the analytic and planner counts and the ratios added."""
    settings = TrainSettings.of(  # plain TP or one process on a CPU: no FSDP
        global_batch_size=batch,
        seq_len=seq,
        micro_batch_size=batch,
        precision=row["precision"],
        sharding="NO_SHARD",
        accelerator="cpu",
        sequence_parallel=row["tp"] > 1,
        activation_checkpointing=row["checkpointing"],
    )
    analytic = analytic_checkpointed_layer_bytes(model, row["tp"], settings)
    planner = checkpointed_layer_bytes(model, row["tp"], settings)
    return {**row, "analytic": analytic, "planner": planner,
            "over_analytic": row["measured"] / analytic,
            "planner_error": planner / row["measured"] - 1}  # fmt: skip


def failures(rows: list[dict]) -> list[str]:
    """What breaks the targets, one line each."""
    out = []
    for r in rows:
        name = f"tp={r['tp']} {r['precision']} {NAMES[r['checkpointing']]}"
        if r["over_analytic"] > MAX_OVER_ANALYTIC:
            out.append(f"{name}: {r['over_analytic']:.3f} x the analytic count")
        if abs(r["planner_error"]) > MAX_PLANNER_ERROR:
            out.append(f"{name}: the planner is {r['planner_error']:+.1%} off")
    plain = {(r["tp"], r["precision"]): r["measured"] for r in rows if r["checkpointing"] == 0}
    for r in rows:
        if r["checkpointing"] == "op" and r["measured"] >= plain[r["tp"], r["precision"]]:
            out.append(
                f"tp={r['tp']} {r['precision']}: op keeps {r['measured']:.0f}, "
                f"not less than none's {plain[r['tp'], r['precision']]:.0f}"
            )
    return out


def render(rows: list[dict]) -> str:
    lines = [
        "| layout | precision | checkpointing | measured | analytic | / analytic | planner | error |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        layout = "one process" if r["tp"] == 1 else f"tp = {r['tp']} + SP"
        lines.append(
            f"| {layout} | {r['precision']} | {NAMES[r['checkpointing']]} | {r['measured']:.0f} "
            f"| {r['analytic']:.0f} | {r['over_analytic']:.3f} | {r['planner']:.0f} "
            f"| {r['planner_error']:+.1%} |"
        )
    return "\n".join(lines)


def measure(out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    script = ROOT / "tests" / "dist" / "actmem_ranks.py"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        str(script),
        str(out),
    ]
    print("measuring on 2 ranks (about half a minute) ...", flush=True)
    subprocess.run(cmd, check=True, env=env, timeout=900)
    return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "dist"))
    from actmem_ranks import BATCH, SEQ
    from actmem_ranks import args as model_args

    with tempfile.TemporaryDirectory() as tmp:
        result = measure(Path(tmp) / "result.json")
    rows = [counted(r, model_args(4), BATCH, SEQ) for r in result["table"]]
    print("bytes per token and block\n" + render(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    bad = failures(rows)
    for line in bad:
        print("FAIL", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
