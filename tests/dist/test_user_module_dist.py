"""A new user's own LightningModule, written from docs/BRING_YOUR_OWN_MODEL.md alone
(`examples/byo_model.py`).

On a gloo process group of one rank: the 3D strategy's `reduce` takes a loss-parallel DTensor and
the view `full_tensor()` returns (the two crashes users hit with Lightning's own) and leaves the
graph intact. In gloo processes (slow, tests/dist/byo_runs.py): the module trains under
fsdp_tuned, fsdp2, tp2, pp2, dp2 x tp2 and tp2 x pp2 with the single-process losses of every
step. (The one-process checks are tests/unit/test_user_module.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from lightning_dist.run.parity_runs import max_relative_difference
from tests.repo import REPO_ROOT

TOLERANCE = 1e-4


# --- the loss under loss parallelism: reduce and log -------------------------------------------


@pytest.fixture
def one_rank_tp_mesh():
    """A real (gloo) process group of one rank, so DTensors and Lightning's reduce run as they
    do on every rank of a run."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


def _loss_parallel_loss(mesh) -> torch.Tensor:
    """The cross-entropy of vocabulary-split logits, as a user's training_step computes it."""
    import torch.nn.functional as F
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    torch.manual_seed(0)
    logits = distribute_tensor(torch.randn(2, 5, 8), mesh, [Shard(-1)]).requires_grad_()
    targets = torch.randint(0, 8, (2, 5))
    with loss_parallel():
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def test_reduce_takes_the_loss_parallel_dtensor_and_its_full_tensor(one_rank_tp_mesh):
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.distributed.tensor import DTensor

    from lightning_dist import Parallel3DStrategy

    # What users hit with Lightning's own reduce: no sharding rule for the in-place all-reduce
    # of a DTensor, and an in-place division of the view that full_tensor() returns.
    stock = ModelParallelStrategy()
    with pytest.raises(NotImplementedError, match="does not have a sharding strategy"):
        stock.reduce(_loss_parallel_loss(one_rank_tp_mesh).detach())
    with pytest.raises(RuntimeError, match="Output 0 of _ToTorchTensor is a view"):
        stock.reduce(_loss_parallel_loss(one_rank_tp_mesh).full_tensor())

    strategy = Parallel3DStrategy()
    loss = _loss_parallel_loss(one_rank_tp_mesh)
    assert isinstance(loss, DTensor)
    value = loss.full_tensor().item()
    reduced = strategy.reduce(loss)
    assert type(reduced) is torch.Tensor and not reduced.requires_grad
    assert reduced.item() == pytest.approx(value)
    full = loss.full_tensor()
    assert strategy.reduce(full).item() == pytest.approx(value)
    assert strategy.reduce(full, reduce_op="sum").item() == pytest.approx(value)
    assert full.item() == value, "reduce must not change the caller's tensor"
    with torch.distributed.tensor.parallel.loss_parallel():
        loss.backward()  # the graph is intact


# --- gloo processes: the doc's module matches one process ---------------------------------------

LAUNCHES = {  # one launch per device count; `single` runs on rank 0 before the others start
    "two": ["single", "fsdp_tuned", "fsdp2", "tp", "pp"],
    "four": ["dp_tp", "tp_pp"],
}


@pytest.mark.slow
def test_the_doc_module_matches_one_process_under_every_layout(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    procs = {}
    for name, layouts in LAUNCHES.items():
        out = tmp_path / f"{name}.json"
        cmd = [
            sys.executable,
            str(REPO_ROOT / "tests" / "dist" / "byo_runs.py"),
            str(out),
            *layouts,
        ]
        procs[name] = (
            subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                cwd=tmp_path,
            ),
            out,
        )
    losses: dict[str, list[float]] = {}
    for proc, out in procs.values():
        output, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0 and out.exists(), output[-4000:]
        losses.update(json.loads(out.read_text()))
    reference = losses.pop("single")
    assert len(reference) == 10 and reference[-1] < reference[0] - 0.5, reference
    for layout, candidate in losses.items():
        diff = max_relative_difference(reference, candidate)
        print(f"PARITY byo {layout}: train {diff:.3e}")
        assert diff <= TOLERANCE, (layout, reference, candidate)
    assert set(losses) == {"fsdp_tuned", "fsdp2", "tp", "pp", "dp_tp", "tp_pp"}
