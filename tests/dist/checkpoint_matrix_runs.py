"""Save under one layout, resume under another: the layout-change matrix of docs/CHECKPOINTS.md.

    python tests/dist/checkpoint_matrix_runs.py OUT_DIR ITEM [ITEM ...]

An ITEM is a layout name (a save) or TARGET:SOURCE[,SOURCE...] (resumes), run in order.

Every layout named in one command uses the same number of devices (Lightning's launcher starts
the other ranks once, by re-running this command), except `single`, which must come first: it
runs on rank 0 alone, before the launch. Each run composes conf/ with Hydra (llama_debug, synthetic data, fp32) and builds the
strategy, module, datamodule and Trainer with lightning_dist.train's own functions.

A save trains the layout for 5 of 10 steps and saves OUT_DIR/<layout>/step5.ckpt (`single`
trains all 10: the uninterrupted reference). A resume restarts TARGET from each SOURCE's
step5.ckpt to step 10; right after the restore each rank compares every parameter and optimizer value it
holds, gathered whole, with the checkpoint's (bitwise). Every run records the sample ids of each
step's batch. Each rank writes OUT_DIR/<run>.rank<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import lightning as L
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lightning_dist.checkpoint.format import flatten, gather_state, read_full_state  # noqa: E402
from lightning_dist.config import compose_config  # noqa: E402
from lightning_dist.config.targets import build  # noqa: E402
from lightning_dist.run.build import build_module, build_trainer  # noqa: E402
from lightning_dist.run.plan import plan_run  # noqa: E402

STEPS, SAVE_AT = 10, 5
BASE = [
    "model=llama_debug", "data=synthetic", "data.global_batch_size=8", "data.seq_len=16",
    "data.num_samples=256", "logger=none", "trainer.max_steps=10",
    "trainer.val_check_interval=null", "trainer.num_sanity_val_steps=0", "callbacks=none",
]  # fmt: skip
LAYOUTS = {
    "single": ["strategy=single", "hardware.devices=1"],
    "ddp": ["strategy=ddp", "hardware.devices=2"],
    # ZeRO-1: the optimizer states sharded over the replicas, written whole in the one format.
    "ddp_zero1": ["strategy=ddp", "hardware.devices=2", "strategy.shard_optimizer=true"],
    "fsdp2": ["strategy=fsdp2", "hardware.devices=2"],
    # Sequence parallelism changes no parameter and no checkpoint: these run TP without it (as
    # before it became the default), which the matrix's 10-step runs make 9 s cheaper.
    "tp2": ["strategy=tp", "hardware.devices=2", "strategy.sequence_parallel=false"],
    "pp2": ["strategy=pp", "hardware.devices=2", "strategy.schedule=1F1B"],
    "pp2_v2": [
        "strategy=pp",
        "hardware.devices=2",
        "strategy.schedule=Interleaved1F1B",
        "strategy.virtual_stages=2",
    ],
    "fsdp_full_dp4": [
        "strategy=fsdp",
        "strategy.sharding_strategy=FULL_SHARD",
        "hardware.devices=4",
    ],
    "dp2xtp2": [
        "strategy=3d",
        "strategy.tp=2",
        "hardware.devices=4",
        "strategy.sequence_parallel=false",
    ],
    "dp2xpp2": ["strategy=3d", "strategy.pp=2", "hardware.devices=4"],
    # ... and over the replicas of dp2 x tp2 (DTensor states, written whole, read as slices).
    "dp2xtp2_zero1": [
        "strategy=3d",
        "strategy.tp=2",
        "strategy.dp_replicate=2",
        "strategy.dp_shard=1",
        "hardware.devices=4",
        "strategy.sequence_parallel=false",
        "strategy.shard_optimizer=true",
    ],
    "hsdp_2x2": ["strategy=fsdp2", "strategy.dp_replicate=2", "hardware.devices=4"],
}


class Record(L.Callback):
    """Sample ids of each step and the losses; saves at step 5 (and stops there unless this is
    the reference); in a resumed run, checks the restored state against the checkpoint."""

    def __init__(self, out: Path, *, save_to: Path | None, stop: bool, check: Path | None):
        self.out, self.save_to, self.stop, self.check = out, save_to, stop, check
        self.result: dict = {"ids": {}, "losses": []}
        self._rows: dict[bytes, int] = {}

    def on_train_start(self, trainer, module) -> None:
        dataset = trainer.datamodule.train_set
        self._rows = {dataset[i].numpy().tobytes(): i for i in range(len(dataset))}
        if self.check is not None:
            self.result["restored"] = compare_with_checkpoint(trainer.strategy, self.check)

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        ids = [self._rows[row.numpy().tobytes()] for row in batch.cpu()]
        self.result["ids"].setdefault(str(trainer.global_step + 1), []).extend(ids)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if self.save_to is not None and trainer.global_step == SAVE_AT:
            trainer.save_checkpoint(self.save_to)
            trainer.should_stop = self.stop

    def on_train_end(self, trainer, module) -> None:
        self.result["losses"] = module.step_losses
        self.out.write_text(json.dumps(self.result))


def _same(value, saved) -> bool:
    if torch.is_tensor(value):
        return torch.is_tensor(saved) and torch.equal(value, saved)
    return value == saved or (isinstance(value, tuple) and list(value) == list(saved))


def compare_with_checkpoint(strategy, path: Path) -> dict:
    """This rank's whole (gathered) parameters and optimizer values against the checkpoint."""
    held = flatten(gather_state(strategy.checkpoint_module(), strategy.optimizers, full=True))
    saved = read_full_state(path)
    differ = [
        key for key, value in held.items() if key not in saved or not _same(value, saved[key])
    ]
    return {"keys": sorted(held), "differ": differ, "saved_keys": sorted(saved)}


def run(out_dir: Path, name: str, *, source: str | None) -> None:
    run_name = name if source is None else f"{name}_from_{source}"
    run_dir = out_dir / "runs" / run_name
    overrides = [*BASE, *LAYOUTS[name], f"paths.output_dir={run_dir}"]
    check = None if source is None else out_dir / source / "step5.ckpt"
    if check is not None:
        overrides.append(f"trainer.ckpt_path={check}")
    cfg = compose_config(overrides)
    plan = plan_run(cfg)
    datamodule = build(cfg.data, "data", vocab_size=plan.model.vocab_size)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    module = build_module(plan)
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    record = Record(
        out_dir / f"{run_name}.rank{rank}.json",
        save_to=None if source else out_dir / name / "step5.ckpt",
        stop=name != "single",  # the single run goes on to step 10: the reference
        check=check,
    )
    trainer = build_trainer(plan, [record], None)
    started = time.perf_counter()
    trainer.fit(module, datamodule=datamodule, ckpt_path=plan.ckpt_path)
    record.result["fit_seconds"] = time.perf_counter() - started
    record.out.write_text(json.dumps(record.result))


def main(out_dir: str, items: list[str]) -> None:
    out = Path(out_dir)
    for item in items:
        name, _, sources = item.partition(":")
        if name == "single" and os.environ.get("LOCAL_RANK", "0") != "0":
            continue  # a rank started by the launcher: `single` runs on rank 0 alone
        for source in sources.split(",") if sources else [None]:
            run(out, name, source=source)


if __name__ == "__main__":
    from lightning_dist.runtime.process_end import run_then_end

    run_then_end(main, sys.argv[1], sys.argv[2:])
