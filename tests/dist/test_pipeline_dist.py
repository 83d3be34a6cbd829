"""Global-norm clipping counts the copies of each gradient piece: on a (dp_shard=2, tp=2) mesh of
torch's fake backend (one process, nothing communicated), FSDP2's _StridedShard over TP counts as
a split like Shard, and a piece replicated over tp counts twice. (Cutting, balancing, the layer
protocol and the 3D strategy's checks are tests/unit/test_pipeline.py; the multi-process runs are
tests/dist/test_parallel3d_dist.py.)"""

import pytest
import torch

# --- the strategy's checks, before any process exists -----------------------------------------


@pytest.fixture
def fake_2d_mesh():
    """A (dp_shard=2, tp=2) mesh on torch's fake backend (nothing is communicated)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        yield init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    finally:
        dist.destroy_process_group()


def test_clipping_counts_copies_of_each_piece(fake_2d_mesh):
    """A gradient's local piece is held by stage_size / (number of pieces) ranks; FSDP2 over TP
    shards with _StridedShard, which must count as a split like Shard."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    from lightning_dist.parallel.clip import _local_and_copies

    def copies(mesh, placements):
        grad = DTensor.from_local(torch.ones(2, 2), mesh, placements, run_check=False)
        return _local_and_copies(grad, stage_size=4)[1]

    assert copies(fake_2d_mesh, [_StridedShard(0, split_factor=2), Shard(0)]) == 1
    assert copies(fake_2d_mesh, [Shard(0), Shard(1)]) == 1
    assert copies(fake_2d_mesh, [Shard(0), Replicate()]) == 2
    assert (
        copies(fake_2d_mesh["dp_shard"], [Shard(0)]) == 2
    )  # an FSDP-only norm, replicated over tp
    assert _local_and_copies(torch.ones(3), stage_size=4)[1] == 4  # a plain replicated tensor
