"""Cases of tests/dist/test_world.py, run inside the ranks of a `World`."""

import os


def all_reduce_rank() -> float:
    import torch
    import torch.distributed as dist
    from world import init_group

    init_group()
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    return value.item()


def fail_on_rank_one() -> int:
    rank = int(os.environ["RANK"])
    if rank == 1:
        raise ValueError("rank one refuses")
    return rank


def rank_zero_waits_alone() -> None:
    import time

    import torch.distributed as dist
    from world import init_group

    init_group(timeout_s=600)
    if dist.get_rank() == 0:
        dist.barrier()  # rank 1 never comes: it is stuck elsewhere
    else:
        time.sleep(3600)


_KEPT: list = []


def keep_a_group_alive() -> float:
    """A case whose group outlives it (held here, as a reference cycle through autograd would):
    its gloo loop thread stays in the rank after `destroy_process_group`."""
    import torch
    import torch.distributed as dist
    from world import init_group

    init_group()
    group = dist.new_group([0, 1])
    value = torch.ones(1)
    dist.all_reduce(value, group=group)
    _KEPT.append(group)
    return value.item()


def group_left_by_the_last_case() -> bool:
    import torch.distributed as dist

    return dist.is_initialized()


def float8_all_gather_bytes(all_gather: bool) -> dict:
    """2 ranks: a llama_debug model under FSDP2 with float8 (emulated), one forward and backward
    with every all-gather recorded through the bytes all-gather. Returns, per rank, whether
    every gathered buffer equals (bitwise) the ranks' inputs laid side by side, how many
    gathers were checked, their bytes, and the loss."""
    import torch
    import torch.distributed as dist
    from world import init_group

    from lightning_dist.layout import Layout
    from lightning_dist.models.args import ModelArgs
    from lightning_dist.options.knobs import Float8Options
    from lightning_dist.options.presets import StrategyOptions
    from lightning_dist.parallel.float8 import Float8BytesAllGather
    from lightning_dist.parallel.parallelize import parallelize

    init_group()
    checks: list[bool] = []
    gathered = [0]

    class Recording(Float8BytesAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            work = super().__call__(output_tensor, input_tensor, group, async_op=False)
            inputs = [torch.empty_like(input_tensor.view(torch.uint8)) for _ in range(2)]
            dist.all_gather(inputs, input_tensor.view(torch.uint8).contiguous(), group=group)
            checks.append(torch.equal(output_tensor.view(torch.uint8), torch.cat(inputs)))
            gathered[0] += output_tensor.numel() * output_tensor.element_size()
            return work

    torch.manual_seed(0)
    args = ModelArgs(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=512,
        ffn_hidden_size=128,
        max_seq_len=64,
    )
    model = args.build()
    layout = Layout(dp_shard=2)
    options = StrategyOptions(
        layout=layout, float8=Float8Options(float8="tensorwise", float8_all_gather=all_gather)
    )
    model = parallelize(
        model, layout.build_mesh("cpu"), layout, device=torch.device("cpu"), options=options
    )
    for unit in model.modules():
        if hasattr(unit, "set_custom_all_gather"):
            unit.set_custom_all_gather(Recording())
    tokens = torch.randint(0, 512, (2, 33), generator=torch.Generator().manual_seed(1))
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    block_linears = sum(
        m.weight.numel()
        for m in next(iter(model.layers.values())).modules()
        if isinstance(m, torch.nn.Linear)
    )
    return {
        "bitwise": all(checks),
        "gathers": len(checks),
        "bytes": gathered[0],
        "loss": float(loss.detach()),
        "block_linear_params": block_linears,
    }


def saved_by_compiled_op_policy_blocks() -> dict:
    """2 ranks, tp=2 with sequence parallelism, op-level checkpointing, each block compiled
    (aot_eager), on llama_debug with an MLP 3 x dim wide (so that no column-parallel output has
    a row-parallel output's local shape): the type and local shape of each tensor the compiled
    blocks save for backward (saved-tensor hooks around each block's forward), the local shape
    of a row-parallel matmul's full-sequence output, and the loss."""
    import torch
    from world import init_group

    from lightning_dist.layout import Layout
    from lightning_dist.models.args import ModelArgs
    from lightning_dist.parallel.activation_checkpoint import apply_activation_checkpointing
    from lightning_dist.parallel.compile import apply_compile
    from lightning_dist.parallel.fsdp import block_modules, find_block_types
    from lightning_dist.parallel.tp import apply_tp

    init_group()
    torch.manual_seed(0)
    args = ModelArgs(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=512,
        ffn_hidden_size=192,
        max_seq_len=64,
    )
    model = args.build()
    blocks = find_block_types(model)
    apply_tp(
        model, Layout(tp=2).build_mesh("cpu")["tp"], sequence_parallel=True, loss_parallel=False
    )
    apply_activation_checkpointing(model, blocks, every_n="op")
    apply_compile(model, blocks, backend="aot_eager", tensor_parallel=True)
    saved: list[tuple[int, ...]] = []

    def pack(t):
        local = t.to_local() if hasattr(t, "to_local") else t
        saved.append((type(t).__name__, tuple(local.shape)))
        return t

    for block in block_modules(model, blocks):
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        block.register_forward_pre_hook(lambda *_, h=hooks: h.__enter__())
        block.register_forward_hook(lambda *_, h=hooks: h.__exit__(None, None, None))
    tokens = torch.randint(0, 512, (2, 33), generator=torch.Generator().manual_seed(1))
    logits = model(tokens[:, :-1])
    if hasattr(logits, "full_tensor"):
        logits = logits.full_tensor()
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return {"saved": saved, "full_sequence": [2, 32, 64], "loss": float(loss.detach())}


def loss_parallel_peak_per_logit() -> dict:
    """2 ranks, tp=2: the cross-entropy of vocabulary-split logits under torch's loss_parallel
    (as `strategy.loss_parallel` runs it), with fp32 and with bf16 logits: MemTracker's forward
    high-water and the step's peak beyond the head's weight and gradient, in bytes per logit of
    this rank's shard."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel
    from world import init_group

    from lightning_dist.layout import Layout
    from lightning_dist.measure.step_memory import measure_step

    init_group()
    mesh = Layout(tp=2).build_mesh("cpu")["tp"]
    torch.manual_seed(0)
    tokens, dim, vocab = 512, 16, 4096
    head = torch.nn.Linear(dim, vocab // 2, bias=False)  # this rank's half of the vocabulary
    hidden, targets = torch.randn(tokens, dim), torch.randint(0, vocab, (tokens,))
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    out = {}
    for name, autocast in (("fp32", False), ("bf16", True)):

        def step(autocast=autocast):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                local = head(hidden)
            logits = DTensor.from_local(local, mesh, [Shard(1)])
            with loss_parallel():
                loss = F.cross_entropy(logits.float(), targets)
                del local, logits
                loss.backward()
            opt.step()

        step()
        mem = measure_step(step, head, [opt])
        logits = tokens * vocab // 2
        out[name] = {
            "forward": mem["activations"] / logits,
            "peak": (mem["total"] - mem["params"] - mem["grads"]) / logits,
        }
    return out


def gather_a_dtensor_sharded_twice(groups_before: int, clear: bool) -> list[float]:
    """4 ranks: a fresh default group, `groups_before` unrelated groups (they move the names
    the next groups get), a 2 x 2 mesh, a DTensor sharded over both of its dims, an op on it
    (torch caches the sharding of its output, mesh included) and the result gathered whole.
    With `clear`, torch's DTensor caches are cleared when the group is destroyed, as a run
    does."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from world import init_group

    from lightning_dist._compat import clear_dtensor_caches

    init_group()
    try:
        for _ in range(groups_before):
            dist.new_group(list(range(dist.get_world_size())))
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
        whole = torch.arange(16.0).reshape(8, 2)
        sharded = distribute_tensor(whole, mesh, [Shard(0), Shard(0)])
        return (sharded * 2).full_tensor().sum(0).tolist()  # an op: its sharding is cached
    finally:
        dist.destroy_process_group()
        if clear:
            clear_dtensor_caches()
