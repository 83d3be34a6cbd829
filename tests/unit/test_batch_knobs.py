"""`data.per_rank_batch_size` names one rank's batch (cut into microbatches under pp); its old
name `data.micro_batch_size` still works, with a deprecation line, and never means the
pipeline micro-batch."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate

from lightning_dist.layout import Layout, per_rank_batch


def test_the_new_name_reaches_every_reader(compose):
    cfg = compose("data=synthetic", "data.per_rank_batch_size=2")
    assert cfg.data.per_rank_batch_size == 2
    assert cfg.data.micro_batch_size == 2  # what train.py, pre-flight and strategies read
    dm = instantiate(cfg.data, vocab_size=512)
    assert dm.micro_batch_size == 2 and dm.plan(dp_size=2) == (2, 2)


def test_the_old_name_still_works(compose):
    cfg = compose("data=synthetic", "data.micro_batch_size=2")
    assert cfg.data.per_rank_batch_size is None and cfg.data.micro_batch_size == 2
    assert instantiate(cfg.data, vocab_size=512).plan(dp_size=2) == (2, 2)


def test_both_names_must_agree():
    assert per_rank_batch(None, None) is None
    assert (
        per_rank_batch(4, 4) == 4 and per_rank_batch(None, 4) == 4 and per_rank_batch(4, None) == 4
    )
    with pytest.raises(ValueError, match="data.per_rank_batch_size=4 and its deprecated name"):
        per_rank_batch(4, 2)


def test_the_pipeline_error_names_the_per_rank_batch():
    with pytest.raises(ValueError) as err:
        Layout(pp=2, microbatches=32).check_batch(64, micro_batch_size=1)
    assert "data.per_rank_batch_size=1 (one rank's batch, which pp cuts into its microbatches)" in (
        str(err.value)
    )
    assert "microbatches=32" in str(err.value)
