"""Packed supervised fine-tuning (`format: chat`, lm/chat.py) on 2 ranks against one process:
data-parallel (fsdp2, dp_shard=2) and context-parallel (3d, cp=2) runs of 10 steps train the
same losses as `strategy=single`, within 1e-4 relative. Each rank's micro-batches hold different
numbers of trained (assistant) targets, so a loss that were each rank's own masked mean would
not match (measured: each micro-batch scaled by its own counts instead of the step's, dp2
differs from one process by 8.2e-2); under cp the mask is split with the sequence.
The single-process reference runs in this process, the 2-rank runs in the session's world."""

from __future__ import annotations

import pytest

from lightning_dist.config import compose_config
from lightning_dist.run.parity_runs import max_relative_difference
from lightning_dist.train import train
from tests.unit.test_sft import chat_file

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4
LAYOUTS = {
    "dp2": ["strategy=fsdp2", "hardware.devices=2"],
    "cp2": ["strategy=3d", "strategy.cp=2", "hardware.devices=2"],
}


def _overrides(data: str) -> list[str]:
    return [
        "model=llama_debug", "data=mixture", f"data.sources=[{{path: {data}, format: chat}}]",
        "data.pack_documents=true", "data.seq_len=64", "data.global_batch_size=4",
        "data.val_fraction=0.2", "logger=none", "trainer.max_steps=10",
        "trainer.val_check_interval=null", "optim.lr=1e-2", "optim.warmup_steps=1",
        "~callbacks.comm", "trainer.memory_by_category_step=0", "report=false",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The chat file and one process's 10 losses."""
    folder = tmp_path_factory.mktemp("sft")
    data = chat_file(folder / "chat.jsonl", n=60)
    cfg = compose_config(
        ["strategy=single", *_overrides(str(data)), f"paths.output_dir={folder / 'single'}"]
    )
    return data, folder, train(cfg)["losses"]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_packed_sft_matches_one_process(train_in, reference, layout):
    data, folder, single = reference
    summary = train_in([*LAYOUTS[layout], *_overrides(str(data))], folder / layout)
    difference = max_relative_difference(single, summary["losses"])
    print(f"{layout}: max relative difference over {len(single)} steps {difference:.2e}")
    assert len(single) == 10 and difference < TOLERANCE, (single, summary["losses"])
