"""A Hugging Face Mixtral (tiny, random) imported into our checkpoint format, trained 3 steps
under expert parallelism (ep2 on 2 gloo ranks), exported back and loaded by transformers'
`AutoModelForCausalLM`: the first step's loss is transformers' own, the export's logits are ours
within 1e-5 (tests/unit/test_hf_moe.py runs the same round trip in one process)."""

from __future__ import annotations

import pytest

from tests.unit.test_hf_moe import (  # noqa: F401 - `imported` is a module fixture, used by name
    check_trained_round_trip,
    imported,
    train_imported,
)

pytest.importorskip("transformers", reason="HF conversions need the [hf] extra")


def test_imported_mixtral_trains_under_ep2_and_exports_back(imported, train_in, tmp_path):  # noqa: F811
    hf_dir, ckpt = imported
    ep2 = ["strategy=3d", "hardware.devices=2", "strategy.ep=2"]
    summary = train_imported(train_in, ckpt, ep2, tmp_path / "run")
    assert summary["layout"].get("ep") == 2, summary["layout"]
    check_trained_round_trip(summary, tmp_path / "run", hf_dir, tmp_path / "hf")
