"""Library-level cases of tests/dist/test_expert_parallel_dist.py, run inside the ranks of a
started world (tests/dist/world.py): one forward and backward of moe_debug under a layout
against one device's (each rank computes that reference itself), the expert weights' bytes
per rank, checkpoints between layouts, and a user's own LightningModule under
`Parallel3DStrategy(ep=2)`."""

from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

GLOBAL_BATCH, SEQ_LEN = 8, 128


@functools.cache
def moe_debug(**changes):
    """moe_debug's MoEArgs (through its Hydra schema), with `changes`."""
    import dataclasses

    from lightning_dist.config import compose_config, model_spec

    args = model_spec(compose_config(["model=moe_debug", "paths.output_dir=unused"]))
    return dataclasses.replace(args, **changes)


def tokens(seed: int = 1) -> torch.Tensor:
    """The global batch: 8 windows of 129 tokens."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (GLOBAL_BATCH, SEQ_LEN + 1), generator=generator)


def build(args, seed: int = 0) -> nn.Module:
    """The model, built on meta and materialised from `seed` (the same weights on every rank)."""
    from lightning_dist.models.materialize import materialize

    with torch.device("meta"):
        model = args.build()
    return materialize(model, torch.device("cpu"), seed).train()


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """CausalLM.loss_fn's: a plain tensor also under loss parallelism."""
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    return loss.full_tensor() if hasattr(loss, "full_tensor") else loss


def one_device(args, batch: torch.Tensor) -> tuple[float, float, dict[str, torch.Tensor]]:
    """(LM loss, aux loss, gradient of every parameter) of one device on the whole batch."""
    from lightning_dist.models.moe import moe_layers, take_aux_loss

    model = build(args)
    lm = cross_entropy(model(batch[:, :-1]), batch[:, 1:])
    aux = take_aux_loss(moe_layers(model))
    (lm + aux).backward()
    return float(lm.detach()), float(aux.detach()), {n: p.grad for n, p in model.named_parameters()}


def parallel(args, knobs: dict):
    """(layout, this rank's parallelised model, options) of the 3d strategy's `knobs`."""
    import torch.distributed as dist

    from lightning_dist.options import PRESETS
    from lightning_dist.parallel.parallelize import parallelize

    options = PRESETS["3d"].build(knobs, "test")
    layout = options.layout.resolve(dist.get_world_size())
    layout.check_model(args)
    options = options.with_knobs(**layout.degrees())
    model = parallelize(
        build(args), layout.build_mesh("cpu"), layout, device=torch.device("cpu"), options=options
    )
    return layout, model, options


def step(model, layout, options, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward of this rank's share of `batch`: (LM loss, aux loss), this rank's."""
    import torch.distributed as dist

    from lightning_dist.models.moe import moe_layers, take_aux_loss
    from lightning_dist.parallel.tp import loss_parallel_context

    share = GLOBAL_BATCH // layout.dp
    d = layout.dp_rank(dist.get_rank())
    mine = batch[d * share : (d + 1) * share]
    with loss_parallel_context(layout.tp, options.tp.loss_parallel):
        if getattr(model, "computes_loss", False):  # a pipeline: forward and backward
            lm = model(mine[:, :-1], mine[:, 1:], cross_entropy)
            return lm, model.take_aux_loss()
        lm = cross_entropy(model(mine[:, :-1]), mine[:, 1:])
        aux = take_aux_loss(moe_layers(model))
        (lm + aux).backward()
    return lm.detach(), aux.detach()


def _mean_over_ranks(value: torch.Tensor) -> float:
    import torch.distributed as dist

    value = value.detach().clone().float()
    dist.all_reduce(value)
    return float(value) / dist.get_world_size()


def _local_bytes(params) -> int:
    return sum(
        (p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size() for p in params
    )


def _measure_compute(model: nn.Module, record: list[int]) -> None:
    """Record the bytes of expert weights each MoE layer holds while it computes: a hook after
    FSDP's own pre-forward hook, which gathers them."""
    from lightning_dist.models.moe import moe_layers

    for m in moe_layers(model):
        m.experts.register_forward_pre_hook(
            lambda module, args: record.append(_local_bytes(module.parameters()))
        )


def _gradients(model: nn.Module, ref_grads: dict[str, torch.Tensor]) -> tuple[tuple, list[str]]:
    """(worst relative error of a gradient (norm), its name) and the names compared, of this
    rank's parameters (whole gradients: collective within each stage)."""
    from lightning_dist.checkpoint.canonical import WRAPPER_SEGMENTS
    from lightning_dist.parallel.parallelize import model_parts

    worst, names = (0.0, ""), []
    for part in model_parts(model):
        for wrapped, param in part.named_parameters():
            name = WRAPPER_SEGMENTS.sub("", wrapped)  # activation checkpointing's segments
            grad = param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad
            ref = ref_grads[name]
            worst = max(worst, (float((grad - ref).norm() / ref.norm()), name))
            names.append(name)
    return worst, names


class _Holder(nn.Module):
    """The LightningModule's place in the names: the model is `model` (checkpoint.format)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model


def _checkpoint_module(model: nn.Module) -> nn.Module:
    """What the strategies save: single-process names, pipeline stages merged."""
    from lightning_dist.checkpoint.canonical import canonical_module
    from lightning_dist.parallel.pipeline import PipelinedModel

    return canonical_module(_Holder(model), model if isinstance(model, PipelinedModel) else None)


def _snapshot(model: nn.Module, optimizer) -> dict[str, torch.Tensor]:
    """Every tensor this rank's part holds, whole, by its key in the files (collective)."""
    from lightning_dist.checkpoint import format as ckpt

    state = ckpt.flatten(ckpt.gather_state(_checkpoint_module(model), [optimizer], full=True))
    return {k: v.detach().clone() for k, v in state.items() if isinstance(v, torch.Tensor)}


def _one_device_checkpoint(args, path: Path) -> None:
    """Rank 0 alone, as one device: a step of AdamW on another batch, then its checkpoint."""
    import torch.distributed as dist

    from lightning_dist.checkpoint import format as ckpt
    from lightning_dist.models.moe import moe_layers, take_aux_loss

    solo = dist.new_group([0])
    if dist.get_rank() == 0:
        model, batch = build(args), tokens(10)
        lm = cross_entropy(model(batch[:, :-1]), batch[:, 1:])
        (lm + take_aux_loss(moe_layers(model))).backward()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        optimizer.step()
        ckpt.save_state(ckpt.gather_state(_Holder(model), [optimizer]), path, solo)
        ckpt.finish_folder(path, {"global_step": 1}, {"step": 1})
    dist.barrier()


def layout_chain(folder: str, cases: dict[str, dict], changes: dict) -> dict:
    """Each layout of `cases` (name: 3d knobs) in turn, on moe_debug with `changes`:

    - one forward and backward of the global batch's share against one device's: the global
      LM and aux losses, the worst gradient error and the parameters compared; the expert
      weights' bytes on this rank at rest and while a layer computes;
    - then a step of AdamW (other weights, and an optimizer state to load into), a load of the
      checkpoint before it (the first: one device's, after a step on another batch), whose
      weights and optimizer values this rank must now hold bitwise; and a save of its own, which
      one process reads whole and must find the same.

    Returns {"cases": {name: ...}, "links": {"a->b": (tensors compared, first mismatches)},
    "expert_shapes": the expert weights' shapes in the first layout's files}."""
    import torch.distributed as dist
    from world import init_group

    from lightning_dist.checkpoint import format as ckpt
    from lightning_dist.models.moe import moe_layers

    def tensors(values: dict) -> dict[str, torch.Tensor]:
        return {k: v for k, v in values.items() if isinstance(v, torch.Tensor)}

    init_group()
    rank0 = dist.get_rank() == 0
    args, batch = moe_debug(**changes), tokens()
    ref_lm, ref_aux, ref_grads = one_device(args, batch)
    total = sum(
        p.numel() * p.element_size() for n, p in build(args).named_parameters() if ".experts." in n
    )
    paths = [Path(folder) / f"{i}-{name}" for i, name in enumerate(["single", *cases])]
    ckpt.prepare_folder(paths[0], rank0=rank0, barrier=dist.barrier)
    _one_device_checkpoint(args, paths[0])
    expected = tensors(ckpt.read_values(paths[0]))
    out, links, previous = {}, {}, "single"
    for (name, knobs), before, path in zip(cases.items(), paths[:-1], paths[1:], strict=True):
        layout, model, options = parallel(args, knobs)
        compute: list[int] = []
        _measure_compute(model, compute)
        rest = _local_bytes(p for m in moe_layers(model) for p in m.experts.parameters())
        lm, aux = step(model, layout, options, batch)
        worst, names = _gradients(model, ref_grads)
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, names)  # pipeline ranks: each its stages'
        # tp and pp peers hold the same loss; a mean over every rank is the data-parallel mean
        out[name] = {
            "lm": (_mean_over_ranks(lm), ref_lm), "aux": (_mean_over_ranks(aux), ref_aux),
            "worst_grad": worst, "params_checked": len({n for ns in every for n in ns}),
            "params": len(ref_grads), "expert_bytes_total": total,
            "expert_bytes_at_rest": rest, "expert_bytes_computing": max(compute, default=0),
        }  # fmt: skip
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        optimizer.step()
        ckpt.load_state(
            _checkpoint_module(model),
            [optimizer],
            before,
            whole_model=not hasattr(model, "computes_loss"),
        )
        got = _snapshot(model, optimizer)
        bad = [k for k, v in got.items() if k not in expected or not torch.equal(v, expected[k])]
        links[f"{previous}->{name}"] = (len(got), bad[:5])
        ckpt.prepare_folder(path, rank0=rank0, barrier=dist.barrier)
        ckpt.save_state(ckpt.gather_state(_checkpoint_module(model), [optimizer]), path)
        read = [None]
        if rank0:
            ckpt.finish_folder(path, {"global_step": 1}, {"step": 1})
            files = tensors(ckpt.read_full_state(path))  # one process, manifest checked
            bad = [k for k in expected if k not in files or not torch.equal(files[k], expected[k])]
            read = [(len(files), bad[:5])]
        dist.broadcast_object_list(read)
        links[f"{name}->single"] = read[0]
        previous = name
    shapes = ckpt.tensor_shapes(paths[1])
    experts = {
        k: list(v) for k, v in shapes.items() if k.startswith(ckpt.WEIGHTS) and ".experts." in k
    }
    return {"cases": out, "links": links, "expert_shapes": experts}


def empty_rank_case() -> dict:
    """ep over this world's ranks with every router biased away from all experts but the
    first rank's, so the other ranks receive no rows at all (empty all-to-all splits, an empty
    grouped matmul): one forward and backward against one device's with the same bias. Returns
    the worst gradient error and the rows each MoE layer's experts received on this rank."""
    import torch.distributed as dist
    from world import init_group

    from lightning_dist.layout import Layout
    from lightning_dist.models.moe import moe_layers, take_aux_loss
    from lightning_dist.parallel.parallelize import parallelize

    init_group()
    world = dist.get_world_size()
    args, batch = moe_debug(), tokens()

    def biased(model: nn.Module) -> nn.Module:
        bias = torch.full((args.num_experts,), -1e3)
        bias[: args.num_experts // world] = 0.0  # the first rank's experts only
        for m in moe_layers(model):
            m.router.expert_bias.copy_(bias)
        return model

    reference = biased(build(args))
    lm = cross_entropy(reference(batch[:, :-1]), batch[:, 1:])
    (lm + take_aux_loss(moe_layers(reference))).backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    layout = Layout(dp_shard=world, ep=world)
    model = parallelize(
        biased(build(args)), layout.build_mesh("cpu"), layout, device=torch.device("cpu")
    )
    rows: list[int] = []
    for m in moe_layers(model):
        m.experts.register_forward_pre_hook(lambda module, a: rows.append(a[0].shape[0]))
    share = GLOBAL_BATCH // world
    mine = batch[dist.get_rank() * share : (dist.get_rank() + 1) * share]
    lm = cross_entropy(model(mine[:, :-1]), mine[:, 1:])
    (lm + take_aux_loss(moe_layers(model))).backward()
    worst, _ = _gradients(model, ref_grads)
    return {"worst_grad": worst, "rows": rows}


# --- a user's own LightningModule ---------------------------------------------------------------


def user_module_case(steps: int) -> dict:
    """A LightningModule a user writes around our MoE model (`MoEArgs.build()` in
    `configure_model`, handed to `self.trainer.strategy.parallelize_model`), trained by
    `Trainer(strategy=Parallel3DStrategy(ep=<world size>))` on this world's ranks, against the same
    steps in a plain torch loop on one device: {"losses", "reference", "expert_placements"}."""
    import os

    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_dist import Parallel3DStrategy
    from lightning_dist.models.moe import moe_layers, take_aux_loss

    args = moe_debug(bias_update_rate=0.0)  # the bias update needs our CausalLM's loads

    class UserLM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = None
            self.losses: list[float] = []

        def configure_model(self) -> None:
            if self.model is None:
                with torch.device("meta"):
                    model = args.build()
                self.model = self.trainer.strategy.parallelize_model(model, init_seed=0)

        def training_step(self, batch, batch_idx):
            (window,) = batch
            loss = cross_entropy(self.model(window[:, :-1]), window[:, 1:])
            loss = loss + take_aux_loss(moe_layers(self.model))
            self.losses.append(float(self.trainer.strategy.reduce(loss.detach())))
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    data = torch.cat([tokens(s) for s in range(steps)])
    module = UserLM()
    world = int(os.environ["WORLD_SIZE"])
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=Parallel3DStrategy(ep=world),
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    # Each rank reads its share of every global batch, in order (Lightning's sampler shuffles).
    share, rank = GLOBAL_BATCH // world, int(os.environ["RANK"])
    mine = torch.cat([b[rank * share : (rank + 1) * share] for b in data.split(GLOBAL_BATCH)])
    trainer.fit(module, DataLoader(TensorDataset(mine), batch_size=share, shuffle=False))
    placements = sorted({str(m.experts.w1.placements) for m in moe_layers(module.model)})
    reference = []
    model = build(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for batch in data.split(GLOBAL_BATCH):
        loss = cross_entropy(model(batch[:, :-1]), batch[:, 1:]) + take_aux_loss(moe_layers(model))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        reference.append(float(loss))
    return {"losses": module.losses, "reference": reference, "expert_placements": placements}
