"""Cases of tests/dist/test_mesh_runtime_dist.py: a plain PyTorch loop over `MeshRuntime`
(examples/mesh_runtime_loop.py), run inside the ranks of a `World`, layout after layout."""

from __future__ import annotations

import runpy

from tests.repo import REPO_ROOT

EXAMPLE = str(REPO_ROOT / "examples" / "mesh_runtime_loop.py")


def plain_loop_losses(model: dict, settings: dict, layouts: dict[str, dict]) -> dict:
    """{layout name: the losses of each step} of the example's loop with `settings` on the
    model of `model` (ModelArgs fields), for each of `layouts` (strategy knobs of a preset:
    {"preset": "3d", "tp": 2}); every rank returns them."""
    import torch.distributed as dist
    from world import init_group

    from lightning_dist.mesh import MeshRuntime
    from lightning_dist.models.args import ModelArgs
    from lightning_dist.options import PRESETS

    example = runpy.run_path(EXAMPLE, run_name="world_case")
    init_group()
    args, loop = ModelArgs(**model), example["LoopSettings"](**settings)
    out = {}
    for name, knobs in layouts.items():
        knobs = dict(knobs)
        options = PRESETS[knobs.pop("preset")].build(knobs, name)
        runtime = MeshRuntime(options.declared_layout(num_nodes=1), options, device="cpu")
        losses, optimizer = example["train"](runtime, args, loop)
        out[name] = {"losses": losses, "layout": runtime.layout.describe(),
                     **optimizer_state_size(optimizer)}  # fmt: skip
    dist.barrier()
    return out


def optimizer_state_size(optimizer) -> dict:
    """The bytes of the per-element optimizer states this rank holds (ZeRO-1's shards, or the
    unsharded optimizer's whole states), and each parameter group's local element count."""
    import torch
    from torch.distributed.tensor import DTensor

    from lightning_dist.parallel.sharded_optimizer import ShardedOptimizer

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    groups = [sum(local(p).numel() for p in g["params"]) for g in optimizer.param_groups]
    if isinstance(optimizer, ShardedOptimizer):
        held = optimizer.local_state_bytes()
    else:
        held = sum(
            local(v).numel() * v.element_size()
            for state in optimizer.state.values()
            for v in state.values()
            if torch.is_tensor(v) and v.dim() > 0
        )
    return {"state_bytes": held, "group_elements": groups}


def checkpoint_round_trip(
    model: dict, settings: dict, writer: dict, reader: dict, path: str
) -> dict:
    """Train 2 steps under the `writer` layout and save the runtime's checkpoint (model and
    optimizer) at `path`; load it into a differently initialised model under `reader`. Returns
    the largest difference between the weights saved and those loaded, over how many tensors,
    and the layout the manifest records."""
    import dataclasses

    import torch
    import torch.distributed as dist
    from world import init_group

    from lightning_dist.checkpoint import format as ckpt
    from lightning_dist.checkpoint.manifest import read_manifest
    from lightning_dist.mesh import MeshRuntime
    from lightning_dist.models.args import ModelArgs
    from lightning_dist.options import PRESETS

    example = runpy.run_path(EXAMPLE, run_name="world_case")
    init_group()
    args = ModelArgs(**model)
    loop = dataclasses.replace(example["LoopSettings"](**settings), steps=2)

    def runtime_of(knobs: dict) -> MeshRuntime:
        knobs = dict(knobs)
        options = PRESETS[knobs.pop("preset")].build(knobs, "round trip")
        return MeshRuntime(options.declared_layout(num_nodes=1), options, device="cpu")

    def full_weights(runtime: MeshRuntime) -> dict[str, torch.Tensor]:
        state = ckpt.gather_state(runtime.checkpoint_module(), [], full=True)[ckpt.MODEL_KEY]
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, {k: v.detach().clone() for k, v in state.items()})
        return {k: v for part in every for k, v in part.items()}  # pipeline ranks: their stages

    saver = runtime_of(writer)
    _, optimizer = example["train"](saver, args, loop)
    saver.save(path, [optimizer], meta={"global_step": loop.steps})
    saved = full_weights(saver)

    loader = runtime_of(reader)
    with torch.device("meta"):
        fresh = args.build()
    loaded_model = loader.parallelize(fresh, init_seed=loop.seed + 1)
    meta = loader.load(path, [example["optimizer_for"](loaded_model, loop)])
    loaded = full_weights(loader)
    difference = max(float((saved[k] - loaded[k]).abs().max()) for k in saved)
    return {"tensors": len(saved) if saved.keys() == loaded.keys() else -1,
            "max_difference": difference, "meta_step": meta.get("global_step"),
            "manifest_layout": read_manifest(path)["layout"]}  # fmt: skip


def uneven_zero1_shards() -> dict:
    """ZeRO-1 over this world's ranks on parameter groups whose sizes dp does not divide (the
    last shard padded): 3 AdamW steps beside the unsharded optimizer on the same gradients.
    Returns the largest parameter and state difference, the state bytes this rank holds and
    each group's element count, and whether a state dict loads back into a fresh wrapper."""
    import torch
    import torch.distributed as dist
    from world import init_group

    from lightning_dist.parallel import sharded_optimizer
    from lightning_dist.parallel.sharded_optimizer import ShardedOptimizer

    init_group()
    # All-gathers of 8 elements: the step writes its parameters back in several pieces.
    bucket, sharded_optimizer.GATHER_ELEMENTS = sharded_optimizer.GATHER_ELEMENTS, 8

    def model_and_optimizer():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 3))
        matrices = [p for p in model.parameters() if p.ndim == 2]
        vectors = [p for p in model.parameters() if p.ndim < 2]
        groups = [{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0}]
        return model, torch.optim.AdamW(groups, lr=1e-2)

    (sharded_model, inner), (plain_model, plain) = model_and_optimizer(), model_and_optimizer()
    sharded = ShardedOptimizer(inner)
    for step in range(3):
        torch.manual_seed(step)  # the same batch on every rank: whole, equal gradients
        batch = torch.randn(4, 7)
        for model, optimizer in ((sharded_model, sharded), (plain_model, plain)):
            optimizer.zero_grad()
            model(batch).pow(2).sum().backward()
            optimizer.step()
    pairs = zip(sharded_model.parameters(), plain_model.parameters(), strict=True)
    param_diff = max(float((a - b).abs().max()) for a, b in pairs)
    saved, expected = sharded.state_dict(), plain.state_dict()
    state_diff = max(
        float((saved["state"][i][k] - v).abs().max())
        for i, state in expected["state"].items()
        for k, v in state.items()
    )
    fresh = ShardedOptimizer(model_and_optimizer()[1])
    fresh.load_state_dict(expected)  # the unsharded optimizer's dict: this rank's slice kept
    reloaded = all(
        torch.equal(fresh.inner.state[a.shard][k], sharded.inner.state[b.shard][k])
        for a, b in zip(fresh.flat, sharded.flat, strict=True)
        for k in ("exp_avg", "exp_avg_sq")
    )
    # Two more steps: the second layer without gradients (torch's AdamW skips its parameters:
    # no decay, no moment update), then none at all (the NaN guard's skipped step).
    for step, frozen in ((3, [1]), (4, [0, 1])):
        torch.manual_seed(step)
        batch = torch.randn(4, 7)
        for model, optimizer in ((sharded_model, sharded), (plain_model, plain)):
            optimizer.zero_grad()
            model(batch).pow(2).sum().backward()
            for layer in frozen:
                for param in model[layer].parameters():
                    param.grad = None
            optimizer.step()
    pairs = zip(sharded_model.parameters(), plain_model.parameters(), strict=True)
    skip_param_diff = max(float((a - b).abs().max()) for a, b in pairs)
    saved, expected = sharded.state_dict(), plain.state_dict()
    skip_state_diff = max(  # the moments; `step` is the group's count here, per parameter there
        float((saved["state"][i][k] - state[k]).abs().max())
        for i, state in expected["state"].items()
        for k in ("exp_avg", "exp_avg_sq")
    )
    reduced = zero1_reduce_scatters_instead_of_all_reducing(model_and_optimizer)
    dist.barrier()
    sharded_optimizer.GATHER_ELEMENTS = bucket
    return {"param_diff": param_diff, "state_diff": state_diff, "reloaded": reloaded, **reduced,
            "skip_param_diff": skip_param_diff, "skip_state_diff": skip_state_diff,
            "state_bytes": sharded.local_state_bytes(),
            "group_elements": [sum(p.numel() for p in g["params"]) for g in plain.param_groups]}  # fmt: skip


def zero1_reduce_scatters_instead_of_all_reducing(model_and_optimizer) -> dict:
    """The strategies' ZeRO-1 on a DDP model: each rank its own batch, the communication hook
    `strategy=ddp` registers under it (it sends nothing) and the optimizer's reduce-scatter
    (8 elements at a time: several pieces, the last shard padded), clipped by the global norm,
    for 3 steps beside AdamW on the mean gradient. Returns the largest parameter and norm
    difference, and the c10d collectives the steps issued by name, with the largest tensor
    any all-reduce among them carried (in elements)."""
    from collections import Counter

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from lightning_dist._compat import dispatch_mode_class
    from lightning_dist.cluster.grad_sync import gradient_hook
    from lightning_dist.parallel import gradient_reduction
    from lightning_dist.parallel.sharded_optimizer import ShardedOptimizer

    class Collectives(dispatch_mode_class()):  # every c10d op the step issues, DDP's too
        def __init__(self):
            super().__init__()
            self.calls, self.largest_all_reduce = Counter(), 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "c10d":
                self.calls[func.name()] += 1
                if "allreduce" in func.name():
                    self.largest_all_reduce = max(
                        self.largest_all_reduce, *(t.numel() for t in args[0])
                    )
            return func(*args, **(kwargs or {}))

    pieces, gradient_reduction.REDUCE_ELEMENTS = gradient_reduction.REDUCE_ELEMENTS, 8
    world, rank = dist.get_world_size(), dist.get_rank()
    (model, inner), (mean_model, plain) = model_and_optimizer(), model_and_optimizer()
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(*gradient_hook("none", local=True))  # as strategy=ddp under ZeRO-1
    zero1 = ShardedOptimizer(inner, reduce_gradients=True)
    counter, norm_diff = Collectives(), 0.0
    # The last step: rank 0 has no gradient for the second layer (FSDP2 leaves a parameter a
    # replica did not use without one, where DDP fills zeros): reduced with its zeros and
    # stepped on every rank, not half-stepped by the replicas owning its other elements.
    for step, unused_on_rank0 in ((0, False), (1, False), (2, False), (3, True)):
        batches = [torch.randn(4, 7, generator=torch.Generator().manual_seed(10 * step + r))
                   for r in range(world)]  # fmt: skip
        zero1.zero_grad()
        with counter:
            ddp(batches[rank]).pow(2).sum().backward()
            if unused_on_rank0 and rank == 0:
                for param in model[1].parameters():
                    param.grad = None
            norm = zero1.clip_grad_norm_(1.0, stage_size=world)
            zero1.step()
        plain.zero_grad()
        for r, batch in enumerate(batches):
            (mean_model(batch).pow(2).sum() / world).backward()
            if unused_on_rank0 and r == 0:  # rank 0's part of the second layer: zeros
                for param in mean_model[1].parameters():
                    param.grad.zero_()
        expected = torch.nn.utils.clip_grad_norm_(mean_model.parameters(), 1.0)
        plain.step()
        norm_diff = max(norm_diff, abs(float(norm) - float(expected)) / float(expected))
    pairs = zip(model.parameters(), mean_model.parameters(), strict=True)
    gradient_reduction.REDUCE_ELEMENTS = pieces
    return {"reduced_param_diff": max(float((a - b).abs().max()) for a, b in pairs),
            "reduced_norm_diff": norm_diff, "collectives": dict(counter.calls),
            "largest_all_reduce": counter.largest_all_reduce}  # fmt: skip
