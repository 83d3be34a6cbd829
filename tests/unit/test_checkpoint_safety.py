"""Loading a torch.distributed.checkpoint folder never runs code from it (checkpoint/safe.py)."""

from __future__ import annotations

import io
import os
import pickle
import warnings

import pytest
import torch
from torch import nn

from lightning_dist.checkpoint import safe


class _RunsACommand:
    """Unpickling this runs `touch <marker>`: what a crafted checkpoint would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _save_real_checkpoint(path) -> dict:
    """A DCP folder of a model with AdamW state flattened per parameter, as our strategies save."""
    from torch.distributed.checkpoint import save
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)).to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    model(torch.randn(2, 4, dtype=torch.bfloat16)).sum().backward()
    optimizer.step()
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    state = {
        "state_dict": get_model_state_dict(model),
        "optimizer_0": get_optimizer_state_dict(model, optimizer, options=options),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        save(state, checkpoint_id=path, no_dist=True)
    return state


def test_a_real_checkpoint_loads_through_the_safe_readers(tmp_path):
    saved = _save_real_checkpoint(tmp_path / "ckpt")
    target = {
        "state_dict": {k: torch.zeros_like(v) for k, v in saved["state_dict"].items()},
        "optimizer_0": {
            k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None
            for k, v in saved["optimizer_0"].items()
        },
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        safe.load(target, tmp_path / "ckpt", no_dist=True)
    for key, value in saved["state_dict"].items():
        assert torch.equal(target["state_dict"][key], value), key
    for key, value in saved["optimizer_0"].items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(target["optimizer_0"][key], value), key
        else:  # hyper-parameters travel as bytes, read with weights_only=True
            assert target["optimizer_0"][key] == value, key


def test_a_crafted_metadata_file_is_refused_and_runs_nothing(tmp_path):
    _save_real_checkpoint(tmp_path / "ckpt")
    marker = tmp_path / "marker"
    (tmp_path / "ckpt" / ".metadata").write_bytes(pickle.dumps(_RunsACommand(marker)))
    with pytest.raises(safe.CheckpointError, match=r"posix\.system|os\.system") as error:
        safe.read_metadata_file(tmp_path / "ckpt" / ".metadata")
    assert "\n" not in str(error.value)
    with pytest.raises(safe.CheckpointError):
        safe.load({"state_dict": {}}, tmp_path / "ckpt", no_dist=True)
    assert not marker.exists(), "the crafted metadata ran its command"


def test_a_truncated_metadata_file_is_one_clear_error(tmp_path):
    _save_real_checkpoint(tmp_path / "ckpt")
    metadata = tmp_path / "ckpt" / ".metadata"
    metadata.write_bytes(metadata.read_bytes()[:40])
    with pytest.raises(safe.CheckpointError, match="interrupted or the file is damaged"):
        safe.read_metadata_file(metadata)


def test_a_crafted_value_entry_is_refused_and_runs_nothing(tmp_path):
    """Non-tensor entries are pickles too; DCP's own planner loads them with weights_only=False."""
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

    marker = tmp_path / "marker"
    payload = io.BytesIO()
    torch.save(_RunsACommand(marker), payload)
    payload.seek(0)
    planner = safe.SafeLoadPlanner()
    planner.flatten_state_dict = False
    planner.state_dict = {}
    item = ReadItem(
        type=LoadItemType.BYTE_IO,
        dest_index=MetadataIndex("optimizer_0.param_groups.w.lr"),
        dest_offsets=torch.Size([0]),
        storage_index=MetadataIndex("optimizer_0.param_groups.w.lr"),
        storage_offsets=torch.Size([0]),
        lengths=torch.Size([0]),
    )
    with pytest.raises(safe.CheckpointError, match="not plain data"):
        planner.load_bytes(item, payload)
    assert not marker.exists()
