"""Each private API in lightning_dist/_compat.py still exists where it was found.

An upgrade of torch, Lightning or transformers that moves one fails here, by name."""

import inspect

import pytest

from lightning_dist import _compat


def test_torch_private_apis_are_where_they_were():
    apply_ac, wrapper = _compat.checkpoint_wrapper_api()
    assert callable(apply_ac) and callable(wrapper)
    tracker = _compat.mem_tracker_class()
    for name in _compat.MEM_TRACKER_INTERNALS:
        assert callable(getattr(tracker, name, None)), f"MemTracker.{name} moved"
    assert "_in_opt" in inspect.getsource(tracker), "MemTracker._in_opt moved"
    assert "_mod_tracker" in inspect.getsource(tracker), "MemTracker._mod_tracker moved"
    assert _compat.in_backward() is False
    kinds = _compat.pipeline_action_types()
    for kind in ("FORWARD", "SEND_F", "RECV_F", "UNSHARD", "RESHARD"):
        assert hasattr(kinds, kind), f"_ComputationType.{kind} moved"
    assert callable(_compat.schedule_ops_api()), "get_schedule_ops moved"


def test_dcp_metadata_records_and_helpers_are_where_they_were():
    import importlib

    for module, names in _compat.DCP_METADATA_RECORDS.items():
        found = importlib.import_module(module)
        for name in names:
            assert hasattr(found, name), f"{module}.{name} moved"
    assert callable(_compat.dcp_set_element())
    from torch.distributed.checkpoint import FileSystemReader

    reader = FileSystemReader("/nonexistent")
    assert str(_compat.dcp_metadata_path(reader, None)).endswith("/.metadata")


def test_in_backward_is_true_inside_a_backward_pass():
    import torch

    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            seen.append(_compat.in_backward())
            return grad * 2

    Probe.apply(torch.ones(1, requires_grad=True)).sum().backward()
    assert seen == [True]


def test_lightning_private_apis_are_where_they_were():
    from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
    from lightning.fabric.utilities.load import _METADATA_FILENAME
    from lightning.pytorch.loggers import WandbLogger
    from lightning.pytorch.strategies.launchers import subprocess_script as trainer_launcher

    assert _METADATA_FILENAME == _compat.LIGHTNING_CHECKPOINT_METADATA
    assert callable(fabric_launcher._hydra_subprocess_cmd)
    assert callable(trainer_launcher._hydra_subprocess_cmd)
    assert "_experiment" in inspect.getsource(WandbLogger.__init__)
    logger = WandbLogger(project="p", mode="disabled")
    assert "anonymous" in logger._wandb_init  # what drop_wandb_anonymous removes
    _compat.drop_wandb_anonymous(logger)
    assert "anonymous" not in logger._wandb_init
    from lightning.pytorch import LightningModule

    assert "_device_mesh" in inspect.getsource(LightningModule.device_mesh.fget)


def test_hydra_reports_errors_through_run_and_report():
    from hydra._internal import utils

    assert callable(utils.run_and_report)
    assert "run_and_report(" in inspect.getsource(utils._run_hydra)  # looked up on each call


def test_transformers_initialised_flag_is_still_used():
    transformers = pytest.importorskip("transformers")
    source = inspect.getsource(transformers.modeling_utils)
    assert _compat.HF_INITIALIZED_FLAG in source


def test_no_private_api_outside_compat():
    """Private torch/Lightning imports live in _compat.py only."""
    import ast
    from pathlib import Path

    package = Path(_compat.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        if path.name == "_compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                root = node.module.split(".")[0]
                private = any(p.startswith("_") for p in node.module.split(".")) or any(
                    a.name.startswith("_") for a in node.names
                )
                if root in ("torch", "lightning", "transformers") and private:
                    offenders.append(f"{path.relative_to(package)}:{node.lineno} {node.module}")
    assert not offenders, offenders


def test_saved_tensors_hooks_active_sees_checkpointing_hooks():
    import torch

    assert _compat.saved_tensors_hooks_active() is False
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        assert _compat.saved_tensors_hooks_active() is True
