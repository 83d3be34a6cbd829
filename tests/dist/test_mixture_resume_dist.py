"""A weighted mixture of three sources (text and a `datasets.save_to_disk` folder, both streamed
(lightning_dist/lm/streaming.py), and a Megatron indexed dataset read as it is;
lightning_dist/lm/mixture.py) resumed at another world size: a 2-rank run saves after step 6;
resumed from there on 1 rank and on 4 ranks, steps 7-10 have the uninterrupted run's losses, the
per-source validation losses of step 10 are its own, and every run reports the same realised
shares. The prepared (all-cached) mixture's resume on 1, 2 and 4 ranks is
tests/unit/test_mixture.py's. Ranks come from the session's started worlds
(tests/dist/world.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_dist.run.parity_runs import max_relative_difference

pytestmark = pytest.mark.slow

RUN = [
    "model=llama_debug", "data=mixture", "data.seq_len=32", "data.global_batch_size=8",
    "data.val_fraction=0.2", "logger=none", "callbacks=none", "trainer.val_check_interval=10",
    "trainer.memory_by_category_step=0", "trainer.max_steps=10",
]  # fmt: skip
WORLDS = {
    1: ["strategy=single", "hardware.devices=1"],
    2: ["strategy=ddp", "hardware.devices=2"],
    4: ["strategy=ddp", "hardware.devices=4"],
}


def write_sources(folder) -> list[str]:
    """Text and an HF dataset on disk (both streamed, in chunks of 16 windows so that several
    chunks and epochs pass in 10 steps) and a Megatron indexed dataset, at weights 0.5 / 0.3 /
    0.2."""
    datasets = pytest.importorskip("datasets", reason="the [data] extra reads HF datasets")
    from tests.unit.test_mixture import write_megatron

    (folder / "prose").mkdir()
    for i in range(4):
        (folder / "prose" / f"{i}.txt").write_text(
            "".join(f"the {j}th fox jumps over dog {i}\n" for j in range(60))
        )
    code = [
        "".join(f"def f{j}(x):\n    return x * {j}\n" for j in range(k, k + 12))
        for k in (0, 12, 24)
    ]
    datasets.Dataset.from_dict({"text": code}).save_to_disk(str(folder / "code"))
    ids = np.random.default_rng(0).integers(0, 512, 6000)
    streamed = "stream: true, shuffle_windows: 16"
    write_megatron(folder / "ids", [ids[:2500], ids[2500:]])
    sources = (
        f"data.sources=[{{path: {folder / 'prose'}, weight: 0.5, {streamed}}}, "
        f"{{path: {folder / 'code'}, format: hf_disk, weight: 0.3, {streamed}}}, "
        f"{{path: {folder / 'ids'}, format: megatron, weight: 0.2}}]"
    )
    return [sources, f"data.cache_dir={folder / 'cache'}"]


def test_a_mixture_resumed_on_1_and_4_ranks_continues_the_2_rank_stream(train_in, tmp_path):
    data = write_sources(tmp_path)
    first = tmp_path / "two_ranks"
    full = train_in(
        [
            *RUN,
            *data,
            *WORLDS[2],
            "trainer.checkpoint.every_n_train_steps=6",
            "trainer.checkpoint.keep_last=null",
        ],
        first,
    )
    assert len(full["losses"]) == 10
    step6 = first / "checkpoints" / "step6.ckpt"
    saved = torch.load(step6 / "meta.pt", weights_only=True)["MixtureDataModule"]
    drawn = dict(zip(saved["mixture"]["names"], saved["mixture"]["drawn"], strict=True))
    assert {name: at["draw"] for name, at in saved["streams"].items()} == {
        "prose": drawn["prose"],
        "code": drawn["code"],
    }  # the streams' positions at step 6
    for ranks in (1, 4):
        resumed = train_in(
            [*RUN, *data, *WORLDS[ranks], f"trainer.ckpt_path={step6}"], tmp_path / f"on_{ranks}"
        )
        assert resumed["world_size"] == ranks
        difference = max_relative_difference(full["losses"][6:], resumed["losses"][-4:])
        assert difference < 1e-6, (ranks, full["losses"][6:], resumed["losses"][-4:])
        assert resumed["data_mixture"] == full["data_mixture"]
        last = {name: losses[-1] for name, losses in resumed["val_losses_by_source"].items()}
        expected = {name: losses[-1] for name, losses in full["val_losses_by_source"].items()}
        assert last.keys() == expected.keys() == {"prose", "code", "ids"}
        assert max_relative_difference(list(expected.values()), list(last.values())) < 1e-6
    shares = [full["data_mixture"][n]["token_share"] for n in ("prose", "code", "ids")]
    assert np.allclose(shares, [0.5, 0.3, 0.2], atol=1 / 80), shares
