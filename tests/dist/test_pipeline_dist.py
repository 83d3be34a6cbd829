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


# --- what a stage keeps per step, in 2 gloo ranks ---------------------------------------------


@pytest.mark.slow
def test_a_stage_keeps_only_the_microbatches_in_flight(worlds):
    """pp2, 8 microbatches (tests/dist/pipeline_memory_cases.py, bench/pipeline_memory.py's
    rows): with `InFlightStage` each rank's peak is below torch's own stage's, within 1.10 x
    the in-flight bound, and the planner within 5% of it; the losses do not change."""
    import importlib.util

    from tests.repo import REPO_ROOT

    spec = importlib.util.spec_from_file_location(
        "bench_pipeline_memory", REPO_ROOT / "bench" / "pipeline_memory.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cases = [
        dict(schedule="1F1B", virtual_stages=1, release=False),
        dict(schedule="1F1B", virtual_stages=1, release=True),
        dict(schedule="Interleaved1F1B", virtual_stages=2, release=True),
    ]
    rows = [bench.counted(r) for part in worlds(2).run("pipeline_memory_cases:stage_memory", cases)
            for r in part]  # fmt: skip
    print(bench.render([r for r in rows if r["schedule"] == "1F1B"]))
    assert bench.failures(rows) == []
    for rank in (0, 1):
        before, after = (r for r in rows if r["rank"] == rank and r["schedule"] == "1F1B")
        assert after["peak"] <= before["peak"] - 7 * 2 * 128 * 64 * 4, (before, after)  # 7 R
        assert after["loss"] == before["loss"]
