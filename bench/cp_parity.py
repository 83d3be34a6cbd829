"""Context parallelism at 512 tokens against one process: the acceptance table of issue 25.

    python bench/cp_parity.py [--packed-only | --unpacked-only] [--steps 10]

Runs `train.py` (llama_debug, `model.max_seq_len=512 data.seq_len=512`, fp32, synthetic data,
10 steps, validation after steps 5 and 10) once on one process and once per layout: cp2
allgather, cp2 ulysses, dp2 x cp2 and cp2 x tp2 (allgather), cp2 x pp2; then the same with
`data.pack_documents=true` against one process with the same document mask. Prints each
layout's largest relative difference of the train losses (every step) and of the validation
losses, and exits 1 if one is above 1e-4. About a minute per run on two cores; the suite's own
parity test (tests/dist/test_context_parallel_train_dist.py) runs 128 tokens on started ranks.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from lightning_dist.run.parity_runs import max_relative_difference, run_train

TOLERANCE = 1e-4
BASE = ["model=llama_debug", "model.max_seq_len=512", "data=synthetic", "data.seq_len=512",
        "trainer.precision=32-true", "trainer.val_check_interval=5", "logger=none",
        "report=false"]  # fmt: skip
LAYOUTS = {
    "cp2 allgather": ["strategy.cp=2", "strategy.cp_mode=allgather", "hardware.devices=2"],
    "cp2 ulysses": ["strategy.cp=2", "strategy.cp_mode=ulysses", "hardware.devices=2"],
    "dp2 x cp2": ["strategy.cp=2", "strategy.dp_shard=2", "hardware.devices=4"],
    "cp2 x tp2": ["strategy.cp=2", "strategy.tp=2", "hardware.devices=4"],
    "cp2 x pp2": ["strategy.cp=2", "strategy.pp=2", "hardware.devices=4"],
}


def run_table(extra: list[str], steps: int, workdir: Path) -> list[tuple[str, float, float]]:
    base = [*BASE, f"trainer.max_steps={steps}", *extra]
    reference = run_train([*base, "strategy=single", "hardware.devices=1"], workdir / "single")
    rows = []
    for name, layout in LAYOUTS.items():
        run = run_train([*base, "strategy=3d", *layout], workdir / name.replace(" ", "_"))
        train = max_relative_difference(reference["losses"], run["losses"])
        val = max_relative_difference(reference["val_losses"], run["val_losses"])
        rows.append((name, train, val))
        print(
            f"{name:<16} {' '.join(extra) or 'unpacked':<24} train {train:.1e}  val {val:.1e}",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/cp_parity.py", description=__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--packed-only", action="store_true")
    group.add_argument("--unpacked-only", action="store_true")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    variants = [[]] if args.unpacked_only else [["data.pack_documents=true"]]
    if not (args.packed_only or args.unpacked_only):
        variants = [[], ["data.pack_documents=true"]]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, extra in enumerate(variants):
            rows += run_table(extra, args.steps, Path(tmp) / str(i))
    worst = max(max(train, val) for _, train, val in rows)
    print(f"{len(rows)} layouts, worst relative difference {worst:.1e} (tolerance {TOLERANCE:.0e})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
