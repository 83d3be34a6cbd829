"""The one checkpoint format in one process: a saved folder reloads bitwise into a fresh model
(optimizer state included), each kind of damage to a folder is one line before anything is read,
a model of another size names the first parameter and both shapes, and pipeline stages merge to
the single-process names. (The layout-change matrix and bad checkpoints through train.py are
tests/dist/test_checkpoint_matrix.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from lightning_dist.checkpoint.canonical import merge_modules
from lightning_dist.checkpoint.format import (
    check_model_shapes,
    finish_folder,
    gather_state,
    load_state,
    read_full_state,
    save_state,
    tensor_shapes,
)
from lightning_dist.checkpoint.manifest import MANIFEST, CheckpointError, open_manifest
from lightning_dist.checkpoint.store import is_complete

# --- one process: the manifest and the names ------------------------------------------------


def _saved(tmp_path: Path, width: int = 4) -> tuple[Path, nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.Linear(width, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, width)).sum().backward()
    optimizer.step()
    path = tmp_path / "step1.ckpt"
    path.mkdir()
    save_state(gather_state(model, [optimizer]), path)
    finish_folder(path, {"global_step": 1}, {"step": 1})
    return path, model, optimizer


def test_a_saved_folder_reloads_bitwise_into_a_fresh_model(tmp_path):
    path, model, optimizer = _saved(tmp_path)
    assert is_complete(path) and json.loads((path / MANIFEST).read_text())["version"] == 1
    torch.manual_seed(1)
    fresh = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.5)
    assert load_state(fresh, [fresh_optimizer], path) == {"global_step": 1}
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(), strict=True)
    )
    saved = read_full_state(path, "optimizer_0.")
    assert saved["optimizer_0.param_groups.0.weight.lr"] == 0.1
    assert torch.equal(
        saved["optimizer_0.state.0.weight.exp_avg"],
        fresh_optimizer.state[fresh[0].weight]["exp_avg"],
    )


@pytest.mark.parametrize(
    "damage",
    [
        "truncated",
        "tampered",
        "partial",
        "extra",
        "no_manifest",
        "future_version",
        "garbage_manifest",
    ],
)
def test_a_damaged_checkpoint_is_one_line_before_anything_is_read(tmp_path, damage):
    path, _, _ = _saved(tmp_path)
    shard = next(path.glob("*.distcp"))
    manifest = json.loads((path / MANIFEST).read_text())
    if damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "tampered":
        data = bytearray(shard.read_bytes())
        data[-1] ^= 1
        shard.write_bytes(bytes(data))
    elif damage == "partial":
        shard.unlink()
    elif damage == "extra":
        (path / "__9_0.distcp").write_bytes(b"x")
    elif damage == "no_manifest":
        (path / MANIFEST).unlink()
    elif damage == "future_version":
        (path / MANIFEST).write_text(json.dumps({**manifest, "version": 2}))
    else:
        (path / MANIFEST).write_text("{not json")
    expected = {
        "truncated": "does not match its hash",
        "tampered": "does not match its hash",
        "partial": "is partial: __0_0.distcp is missing",
        "extra": "does not list",
        "no_manifest": "has no manifest.json",
        "future_version": "format version 2, newer",
        "garbage_manifest": "is not valid JSON",
    }[damage]
    with pytest.raises(CheckpointError, match=expected) as error:
        open_manifest(path)
    assert "\n" not in str(error.value) and str(path) in str(error.value)


def test_a_model_of_another_size_names_the_first_parameter_and_both_shapes(tmp_path):
    path, _, _ = _saved(tmp_path)
    with pytest.raises(
        CheckpointError,
        match=r"parameter 0.weight has shape \[4, 4\] in the "
        r"checkpoint but \[8, 8\] in this model",
    ):
        check_model_shapes(path, {"0.weight": (8, 8), "0.bias": (8,)})
    with pytest.raises(CheckpointError, match="holds parameter 1.bias, which this model lacks"):
        check_model_shapes(path, {n: tuple(s) for n, s in _shapes(path).items() if n != "1.bias"})


def _shapes(path: Path) -> dict:
    return {k.split(".", 1)[1]: v for k, v in tensor_shapes(path).items() if k.startswith("state_")}


def test_pipeline_stages_merge_to_the_single_process_names():
    from lightning_dist.layout import Layout
    from lightning_dist.models.args import ModelArgs
    from lightning_dist.parallel.pipeline import stage_modules

    args = ModelArgs(dim=16, n_layers=4, n_heads=2, n_kv_heads=2, vocab_size=32, ffn_hidden_size=32)
    whole = {n for n, _ in args.build().named_parameters()}
    layout = Layout(pp=2, schedule="Interleaved1F1B", virtual_stages=2, dp_shard=1)
    names = set()
    for pp_rank in range(2):
        parts = [part for _, part in stage_modules(args.build(), layout, pp_rank)]
        held = {n for n, _ in merge_modules(parts).named_parameters()}
        assert "layers.0.attention.wq.weight" in held if pp_rank == 0 else "norm.weight" in held
        names |= held
    assert names == whole
