"""One prepared script for a GPU machine: every strategy that fits the GPUs present, on a
1B-class model in bf16, as one markdown table.

    python bench/gpu.py [--model llama3_1b] [--steps 20] [--out docs/BENCHMARKS.md]

For each strategy it runs `train.py` with `hardware=gpu` (peak FLOP/s and memory taken from the
matching conf/hardware spec when the GPU is one we know, so MFU is real), and reads tokens/s,
MFU, peak memory and the communication/compute ratio from summary.json. Strategies that need
more GPUs than present are skipped, and say so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# GPU name fragment -> the hardware spec whose per-device figures apply.
KNOWN_GPUS = {"H200": "dgx_h200", "H100": "dgx_h100", "A100": "dgx_a100", "4090": "rtx4090_x4"}
# strategy overrides -> GPUs needed
STRATEGIES = {
    "single": (["strategy=single"], 1),
    "ddp": (["strategy=ddp"], 2),
    "fsdp (tuned)": (["strategy=fsdp"], 2),
    "fsdp2": (["strategy=fsdp2"], 2),
    "tp=2": (["strategy=tp", "strategy.tp=2"], 2),
    "pp=2": (["strategy=pp", "strategy.pp=2"], 2),
    "3d 2x2x2": (["strategy=3d", "strategy.tp=2", "strategy.pp=2"], 8),
}


def hardware_overrides(count: int) -> list[str]:
    """`hardware=gpu` plus the datasheet figures of the GPU found, if it is one we know."""
    import torch
    from omegaconf import OmegaConf

    name = torch.cuda.get_device_name(0)
    overrides = ["hardware=gpu", f"hardware.devices={count}"]
    for fragment, spec in KNOWN_GPUS.items():
        if fragment in name:
            known = OmegaConf.load(ROOT / "conf" / "hardware" / f"{spec}.yaml")
            for key in ("memory_gib", "peak_tflops_bf16", "peak_tflops_fp32",
                        "intra_node_gbytes_per_sec"):  # fmt: skip
                overrides.append(f"hardware.{key}={known[key]}")
            break
    return overrides


def run(name: str, overrides: list[str], args, run_dir: Path) -> dict | str:
    cmd = [sys.executable, str(ROOT / "train.py"), f"model={args.model}", "data=synthetic",
           f"data.seq_len={args.seq_len}", f"data.global_batch_size={args.global_batch}",
           f"trainer.max_steps={args.steps}", "trainer.val_check_interval=null", "logger=none",
           "trainer.precision=bf16-mixed", "callbacks.comm.every_n_steps=10", *overrides,
           f"hydra.run.dir={run_dir}"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.timeout)
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        return (errors or proc.stderr.strip().splitlines()[-1:] or ["failed"])[0][:160]
    return json.loads((run_dir / "summary.json").read_text())


def row(name: str, result: dict | str) -> str:
    if isinstance(result, str):
        return f"| {name} | – | – | – | – | – | {result} |"
    peak = max(result["peak_memory_bytes"]) / 1024**3
    mfu = "n/a" if result["mfu"] is None else f"{result['mfu']:.1%}"
    comm = result.get("comm", {}).get("comm_compute_ratio")
    layout = " ".join(f"{k}={v}" for k, v in result["layout"].items() if v > 1) or "1 device"
    return (f"| {name} | {layout} | {result['tokens_per_sec']:,.0f} | {mfu} | {peak:.1f} | "
            f"{'n/a' if comm is None else f'{comm:.1%}'} | final loss {result['final_loss']:.3f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama3_1b")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    args = parser.parse_args()
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        sys.exit("error: no CUDA device here; bench/gpu.py needs a GPU machine")
    lines = ["| strategy | layout | tokens/s | MFU | peak GiB | comm/compute | notes |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for name, (overrides, needed) in STRATEGIES.items():
            if needed > count:
                lines.append(f"| {name} | – | – | – | – | – | needs {needed} GPUs, {count} here |")
                continue
            n = 1 if name == "single" else needed
            result = run(name, overrides + hardware_overrides(n), args, Path(tmp) / name.split()[0])
            lines.append(row(name, result))
            print(lines[-1], flush=True)
    header = (f"\n## GPU benchmark ({datetime.date.today()})\n\n{count} x "
              f"{torch.cuda.get_device_name(0)}, `{args.model}`, bf16-mixed, seq {args.seq_len}, "
              f"global batch {args.global_batch}, {args.steps} steps. Command: "
              f"`python bench/gpu.py --model {args.model}`.\n\n")  # fmt: skip
    table = header + "\n".join(lines) + "\n"
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        f.write(table)


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "offline")
    main()
