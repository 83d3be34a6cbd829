"""A weighted mixture of three sources resumed at another world size (lightning_dist/lm/mixture.py):
a 2-rank run saves after step 6; resumed from there on 1 rank and on 4 ranks, steps 7-10 have
the uninterrupted run's losses, and every run reports the same realised shares. Ranks come from
the session's started worlds (tests/dist/world.py)."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_dist.parity import max_relative_difference

pytestmark = pytest.mark.slow

RUN = [
    "model=llama_debug", "data=mixture", "data.seq_len=32", "data.global_batch_size=8",
    "data.val_fraction=0.2", "logger=none", "callbacks=none", "trainer.val_check_interval=null",
    "trainer.memory_by_category_step=0", "trainer.max_steps=10",
]  # fmt: skip
WORLDS = {
    1: ["strategy=single", "hardware.devices=1"],
    2: ["strategy=ddp", "hardware.devices=2"],
    4: ["strategy=ddp", "hardware.devices=4"],
}


def write_sources(folder) -> list[str]:
    """Two text sources and a token file, at weights 0.5 / 0.3 / 0.2."""
    (folder / "prose").mkdir()
    for i in range(4):
        (folder / "prose" / f"{i}.txt").write_text(
            "".join(f"the {j}th fox jumps over dog {i}\n" for j in range(60))
        )
    (folder / "code.txt").write_text(
        "".join(f"def f{j}(x):\n    return x * {j}\n" for j in range(90))
    )
    np.random.default_rng(0).integers(0, 512, 6000).astype("<u2").tofile(folder / "ids.bin")
    sources = (
        f"data.sources=[{{path: {folder / 'prose'}, weight: 0.5}}, "
        f"{{path: {folder / 'code.txt'}, weight: 0.3}}, "
        f"{{path: {folder / 'ids.bin'}, format: tokens, weight: 0.2}}]"
    )
    return [sources, f"data.cache_dir={folder / 'cache'}"]


def test_a_mixture_resumed_on_1_and_4_ranks_continues_the_2_rank_stream(train_in, tmp_path):
    data = write_sources(tmp_path)
    first = tmp_path / "two_ranks"
    full = train_in([*RUN, *data, *WORLDS[2], "trainer.checkpoint.every_n_train_steps=6",
                     "trainer.checkpoint.keep_last=null"], first)  # fmt: skip
    assert len(full["losses"]) == 10
    step6 = first / "checkpoints" / "step6.ckpt"
    for ranks in (1, 4):
        resumed = train_in(
            [*RUN, *data, *WORLDS[ranks], f"trainer.ckpt_path={step6}"], tmp_path / f"on_{ranks}"
        )
        assert resumed["world_size"] == ranks
        difference = max_relative_difference(full["losses"][6:], resumed["losses"][-4:])
        assert difference < 1e-6, (ranks, full["losses"][6:], resumed["losses"][-4:])
        assert resumed["data_mixture"] == full["data_mixture"]
    shares = [full["data_mixture"][n]["token_share"] for n in ("prose", "code.txt", "ids.bin")]
    assert np.allclose(shares, [0.5, 0.3, 0.2], atol=1 / 80), shares
