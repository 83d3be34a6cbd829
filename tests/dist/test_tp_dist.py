"""Tensor parallelism applied on a fake two-rank process group (torch's fake backend: one process,
no real communication; collectives counted with CommDebugMode): one block's forward issues
exactly the collectives of the Megatron scheme, with and without sequence parallelism, each rank
holds its shard, and under SP the backward gathers the saved shard again while outer saved-tensor
hooks still see every saved tensor. (The plans and their errors are tests/unit/test_tp.py.)"""

import pytest
import torch

from lightning_dist.models.args import ModelArgs
from lightning_dist.parallel.tp import apply_tp

DEBUG = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, ffn_hidden_size=128)


@pytest.fixture
def fake_tp_mesh():
    """A 2-rank tensor-parallel mesh on torch's fake backend: collectives are recorded, not run."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


def _block_comms(mesh, sequence_parallel: bool) -> dict[str, int]:
    from torch.distributed.tensor.debug import CommDebugMode

    model = DEBUG.build()
    apply_tp(model, mesh, sequence_parallel=sequence_parallel)
    seq = 8 // 2 if sequence_parallel else 8  # under SP each rank holds half of the sequence
    with CommDebugMode() as comm:
        model.layers["0"](torch.randn(2, seq, 64), model.rope_cos, model.rope_sin)
    return {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}


def test_block_forward_without_sp_is_two_all_reduces(fake_tp_mesh):
    counts = _block_comms(fake_tp_mesh, sequence_parallel=False)
    print("TP block forward without SP:", counts)
    assert counts == {"all_reduce": 2}


def test_block_forward_with_sp_is_two_gather_scatter_pairs(fake_tp_mesh):
    counts = _block_comms(fake_tp_mesh, sequence_parallel=True)
    print("TP block forward with SP:", counts)
    assert counts == {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2}


def test_local_shapes_after_tp(fake_tp_mesh):
    model = DEBUG.build()
    apply_tp(model, fake_tp_mesh)
    attention = model.layers["0"].attention
    assert attention.wq.weight.to_local().shape == (32, 64)  # 2 of 4 heads x head_dim 16
    assert attention.wk.weight.to_local().shape == (16, 64)  # 1 of 2 kv heads
    assert attention.wo.weight.to_local().shape == (64, 32)
    assert model.tok_embeddings.weight.to_local().shape == (256, 64)  # half the vocabulary


def test_sequence_parallel_saves_the_shard_and_gathers_again_in_backward(fake_tp_mesh):
    """Under SP a block's backward gathers each sub-block's input again (2 all-gathers more than
    the backward of the forward's reduce-scatters), since only the sequence shard was saved."""
    from torch.distributed.tensor.debug import CommDebugMode

    model = DEBUG.build()
    apply_tp(model, fake_tp_mesh, sequence_parallel=True)
    x = torch.randn(2, 4, 64, requires_grad=True)
    with CommDebugMode() as comm:
        out = model.layers["0"](x, model.rope_cos, model.rope_sin)
        out.sum().backward()
    counts = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}
    print("TP block forward and backward with SP:", counts)
    assert counts == {"all_gather_into_tensor": 6, "reduce_scatter_tensor": 4}


def test_sequence_parallel_leaves_outer_saved_tensor_hooks_alone(fake_tp_mesh):
    """Inside activation checkpointing (whose saved-tensor hooks keep nothing of the block) the
    sub-blocks add no hooks of their own, so the outer hooks still see every saved tensor,
    the gathered full-sequence inputs of the projections included."""
    model = ModelArgs(**{**vars(DEBUG), "ffn_hidden_size": 256}).build()  # w2's input: 128 wide
    apply_tp(model, fake_tp_mesh, sequence_parallel=True)
    x = torch.randn(2, 4, 64, requires_grad=True)
    seen = []

    def pack(t):
        local = t.to_local() if hasattr(t, "to_local") else t
        seen.append(tuple(local.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.layers["0"](x, model.rope_cos, model.rope_sin)
    assert (16, 64) in seen  # wq/wk/wv's and w1/w3's input: 2 x 8 tokens, all gathered
