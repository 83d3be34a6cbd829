"""Stored single-process references of the parity cases: per-step train and validation losses.

    python tests/dist/baselines.py          # check every stored reference against a fresh run
    python tests/dist/baselines.py --write  # run them all again and rewrite baselines.json
    python tests/dist/baselines.py --write --only NAME  # (re)write one reference, keep the rest

Each reference is keyed by its name and records the exact `train.py` overrides it ran (a model,
seed, batch and precision are all among them), so a parity case finds its reference by its own
overrides and a changed default shows up as a missing reference, never as a silent mismatch.
`tests/dist/test_baselines.py` recomputes one of them on every run of the suite. A fresh run
matches the file bitwise on the machine that wrote it and to `STORED_MATCH` (1e-6 relative) on
CPUs of other instruction sets, whose matmul kernels differ; every parity bound is 1e-5 or looser.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

PATH = Path(__file__).with_name("baselines.json")
STORED_MATCH = 1e-6
REPO_ROOT = Path(__file__).resolve().parents[2]

LLAMA = ["model=llama_debug", "data=synthetic", "logger=none", "trainer.max_steps=10"]
SINGLE = ["strategy=single", "hardware.devices=1"]
REFERENCES: dict[str, list[str]] = {
    # tests/dist/test_fsdp_dist.py: hard clipping in every run.
    "llama_debug_clip005": [*LLAMA, "trainer.val_check_interval=null",
                            "trainer.gradient_clip_val=0.05", *SINGLE],
    # tests/dist/test_parallel3d_dist.py: validation after steps 5 and 10.
    "llama_debug_val5": [*LLAMA, "trainer.val_check_interval=5", *SINGLE],
    "hf_llama": ["model=hf_llama", "data=synthetic", "logger=none", "trainer.max_steps=10",
                 "trainer.val_check_interval=null", *SINGLE],
    "llama_debug_val5_clip_eps": [*LLAMA, "trainer.val_check_interval=5",
                                  "trainer.gradient_clip_val=0.05", "optim.eps=1e-3",
                                  "optim.warmup_steps=1", "optim.lr=3e-2", *SINGLE],
    # tests/dist/test_context_parallel_train_dist.py: the same with packed documents.
    "llama_debug_val5_clip_eps_packed": [*LLAMA, "trainer.val_check_interval=5",
                                         "trainer.gradient_clip_val=0.05", "optim.eps=1e-3",
                                         "optim.warmup_steps=1", "optim.lr=3e-2",
                                         "data.pack_documents=true", *SINGLE],
    "llama_debug_val5_eps_unclipped": [*LLAMA, "trainer.val_check_interval=5", "optim.eps=1e-3",
                                       "optim.warmup_steps=1", "optim.lr=3e-2",
                                       "trainer.gradient_clip_val=null", *SINGLE],
    # tests/dist/test_slow_links_dist.py: speed-weighted shares [2, 1] of a global batch of 6
    # (micro-batches of 2), with updates large enough that a wrong weighting shows.
    "llama_debug_val5_eps_unclipped_gbs6": [*LLAMA, "trainer.val_check_interval=5",
                                            "optim.eps=1e-3", "optim.warmup_steps=1",
                                            "optim.lr=3e-2", "trainer.gradient_clip_val=null",
                                            "data.global_batch_size=6", *SINGLE],
    # tests/dist/test_context_parallel_train_dist.py: hf_llama with updates large enough that
    # wrong rotary positions show (at the default learning rate they stay within 1e-5).
    "hf_llama_lr1e-2": ["model=hf_llama", "data=synthetic", "logger=none", "trainer.max_steps=10",
                        "trainer.val_check_interval=null", "optim.lr=1e-2", "optim.warmup_steps=1",
                        *SINGLE],
    # tests/dist/test_hf_archs_dist.py: a tiny Qwen2 (q/k/v biases).
    "hf_qwen2": ["model=hf_llama", "model.config.model_type=qwen2", "data=synthetic",
                 "logger=none", "trainer.max_steps=10", "trainer.val_check_interval=null",
                 *SINGLE],
    # tests/dist/test_parallel3d_dist.py: float8 (emulated), micro-batches of one rank's share.
    "llama_debug_val5_float8": [*LLAMA, "trainer.val_check_interval=5",
                                "strategy.float8=tensorwise", "data.micro_batch_size=4", *SINGLE],
    # ... and in the micro-batches of pp=2's 4 pipeline microbatches (2 samples each).
    "llama_debug_val5_float8_mb2": [*LLAMA, "trainer.val_check_interval=5",
                                    "strategy.float8=tensorwise", "data.micro_batch_size=2",
                                    *SINGLE],
    # The mixture of experts (both balancing methods on) at a learning rate at which it
    # learns its one batch of 8 within 10 steps; tests/unit/test_moe.py recomputes it.
    "moe_debug_lr1e-2": ["model=moe_debug", "data=synthetic", "logger=none",
                         "trainer.max_steps=10", "trainer.val_check_interval=5",
                         "data.num_samples=8", "optim.lr=1e-2", "optim.warmup_steps=1", *SINGLE],
    # tests/dist/test_preflight_dist.py: strategy=auto against one process; and
    # tests/cluster/test_multinode.py: two nodes against one process.
    "debug_fast_4": ["debug=fast", "trainer.max_steps=4", "strategy=single"],
    # tests/cluster/test_slurm.py: Slurm's two tasks against one process.
    "debug_fast_8": ["debug=fast", "trainer.max_steps=8", "logger=none", "strategy=single",
                     "hardware.devices=1"],
    # tests/e2e/test_resume_e2e.py: epochs of 5 steps (20 samples), resumed at an epoch's end.
    "debug_fast_8_epoch5": ["debug=fast", "trainer.max_steps=8", "logger=none", "strategy=single",
                            "hardware.devices=1", "data.num_samples=20"],
    # tests/cluster/test_elastic_agents.py: an elastic job of 4, 2 and 4 ranks against one process.
    "debug_fast_40": ["debug=fast", "trainer.max_steps=40", "logger=none", "strategy=single",
                      "hardware.devices=1"],
}  # fmt: skip


QUIET = ["~callbacks.comm", "trainer.memory_by_category_step=0"]
"""Overrides that switch off telemetry which a parity case does not check and which changes no
loss: the comm monitor's profiled step and MemTracker's step (together about 0.8 s of a 2-rank
case of 10 steps, measured). `reference` leaves them out, so such a case is held to the
reference that ran with both on: telemetry changing a loss would fail it."""


def stored() -> dict[str, dict]:
    return json.loads(PATH.read_text())


def reference(overrides: list[str]) -> dict:
    """The stored reference whose overrides are exactly `overrides` (in any order), those of
    `QUIET` left out."""
    wanted = sorted(o for o in overrides if o not in QUIET)
    for entry in stored().values():
        if sorted(entry["overrides"]) == wanted:
            return entry
    raise LookupError(
        f"no stored single-process reference for {overrides}; add it to REFERENCES in "
        "tests/dist/baselines.py and run `python tests/dist/baselines.py --write`"
    )


def matches(entry: dict | None, fresh: dict) -> bool:
    """Whether a stored entry is a fresh run's: same overrides, every loss within STORED_MATCH."""
    from lightning_dist.run.parity_runs import max_relative_difference

    return (
        entry is not None
        and entry["overrides"] == fresh["overrides"]
        and all(
            max_relative_difference(entry[key], fresh[key]) <= STORED_MATCH
            for key in ("losses", "val_losses")
        )
    )


def run(name: str) -> dict:
    """Train reference `name` through train.py, as the parity harness does."""
    sys.path.insert(0, str(REPO_ROOT))
    from lightning_dist.run.parity_runs import run_train

    with tempfile.TemporaryDirectory(prefix=f"baseline-{name}-") as tmp:
        summary = run_train(REFERENCES[name], tmp)
    return {
        "overrides": REFERENCES[name],
        "losses": summary["losses"],
        "val_losses": summary["val_losses"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/dist/baselines.py", description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite tests/dist/baselines.json")
    parser.add_argument(
        "--only",
        action="append",
        choices=list(REFERENCES),
        metavar="NAME",
        help="run only this reference (repeatable); --write keeps the others",
    )
    args = parser.parse_args(argv)
    names = args.only or list(REFERENCES)
    fresh = {}
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name}", flush=True)
        fresh[name] = run(name)
    if args.write:
        kept = {n: e for n, e in stored().items() if n in REFERENCES} if args.only else {}
        PATH.write_text(json.dumps({**kept, **fresh}, indent=1) + "\n")
        print(f"wrote {PATH}")
        return 0
    differs = [n for n in fresh if not matches(stored().get(n), fresh[n])]
    print(
        f"every stored reference is within {STORED_MATCH:g} of a fresh run"
        if not differs
        else f"differ from a fresh run: {', '.join(differs)}"
    )
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
