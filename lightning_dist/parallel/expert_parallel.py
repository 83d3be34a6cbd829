"""Expert parallelism (`strategy.ep`), and a mixture of experts under tensor parallelism: the
MoE layers of `models/moe.py` across ranks (docs/MOE.md, "Expert parallelism"). Pure
torch.distributed; no Lightning.

The mesh. ep borrows ranks from dp_shard: `expert_mesh` splits the root mesh's dp_shard
dimension into (dp_shard_mod_ep, ep), ep innermost, so an expert-parallel group is ep
consecutive dp_shard ranks at the same pp, dp_replicate and tp coordinates. They still read
different batches (the data sampler is unchanged); what they share is the experts.

The experts. `apply_expert_parallel` splits each MoE layer's 3-D expert weights along dim 0 over
the ep group (a DTensor `Shard(0)`: rank r of the group holds experts [r E/ep, (r + 1) E/ep)),
so a checkpoint stores them whole under the single-process names and any layout reads them.
`apply_expert_fsdp` then shards each expert's weights over the dp_shard_mod_ep ranks (along dim
1, since dim 0 is ep's), and `apply_fsdp` the dense weights over all of dp_shard as before.

The dispatch (`ExpertParallel`, the `MoE.run_experts` seam). Each rank routes its own tokens as
one device does; then (1) an all-to-all of the per-expert counts tells each rank how many rows
it gets from each peer for each of its experts, (2) an uneven `all_to_all_single` sends every row
to the rank holding its expert (the rows are sorted by expert, so each peer's are contiguous),
(3) the rows received, grouped by sender, are regrouped by local expert and run through the
grouped matmul of this rank's experts, and (4) the outputs go back by the same steps reversed.
The backward of an all-to-all is the reverse exchange, so each expert's gradient sums the
contributions of every token routed to it from the whole ep group.

The gradient scale. Each rank's loss is the mean over its own tokens, and FSDP divides the dense
gradients by the data-parallel size D = dp_replicate x dp_shard, which makes them the global
mean's. An expert's gradient already holds the sum over its ep group (the all-to-all's
backward) and its FSDP group has D / ep ranks: FSDP's own division (by D / ep) would leave it ep
times too large, so the experts' units divide by D (`set_gradient_divide_factor`).

Tensor parallelism. The feed-forward layers of an MoE model (its MoE layers, and the dense MLPs
of its first `first_k_dense` blocks) are replicated over tp, not split: every tp rank routes
and runs the same tokens, and the experts' all-to-alls run within each tp coordinate's own ep
group. Without sequence parallelism their input is the whole sequence on every tp rank already.
With it, `replicate_over_tp` gathers the sequence before each such layer and keeps this rank's
shard of its output; the backwards are the reverse (this rank's slice of the input's gradient,
a gather of the output's), so every tp rank holds the layer's whole gradient, as one device
does, and no token counts twice in it. The router reads each token's whole hidden state and
computes its logits in float32, so each tp rank routes each token alike, and as one device
does up to the rounding of the hidden states themselves.
"""

from __future__ import annotations

import logging
from functools import partial

import torch
import torch.distributed as dist
from torch import nn

from lightning_dist._compat import unflatten_mesh
from lightning_dist.layout import Layout
from lightning_dist.models.hf import IMPORTABLE_MODEL_TYPES, NOT_IMPORTABLE
from lightning_dist.models.moe import moe_layers, run_grouped_experts

log = logging.getLogger(__name__)

EXPERT_WEIGHTS = ("w1", "w2", "w3")
"""`GroupedExperts`' 3-D weights [num_experts, out, in], split along dim 0 over ep."""


def expert_mesh(mesh, layout: Layout):
    """The root `mesh` (`Layout.build_mesh`) with dp_shard split into (dp_shard_mod_ep, ep)."""
    sizes = (layout.dp_shard // layout.ep, layout.ep)
    return unflatten_mesh(mesh, "dp_shard", sizes, ("dp_shard_mod_ep", "ep"))


def experts_fsdp_mesh(mesh, layout: Layout):
    """The sub-mesh of `expert_mesh` FSDP shards the experts over: dp_shard_mod_ep, with
    dp_replicate before it for HSDP."""
    if layout.dp_replicate > 1:
        return mesh["dp_replicate", "dp_shard_mod_ep"]
    return mesh["dp_shard_mod_ep"]


class _AllToAll(torch.autograd.Function):
    """`all_to_all_single` of rows (dim 0) in uneven splits; backward: the reverse exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def _by_local_expert(received: torch.Tensor) -> torch.Tensor:
    """The order that regroups rows laid out by sender then local expert (`received[q, j]`
    rows from sender q for expert j) by local expert then sender."""
    senders, local = received.shape
    expert = torch.arange(local, device=received.device).repeat(senders)
    return expert.repeat_interleave(received.flatten()).argsort(stable=True)


class ExpertParallel:
    """`MoE.run_experts` over an expert-parallel `group` (the module docs' dispatch): this
    rank's rows, sorted by expert, go to the ranks that hold their experts and come back."""

    def __init__(self, group) -> None:
        self.group = group

    def __call__(self, experts: nn.Module, x: torch.Tensor, counts: torch.Tensor):
        group = self.group
        received, send_rows, recv_rows = self.exchange_counts(counts)
        rows = _AllToAll.apply(x, recv_rows, send_rows, group)
        # The module call, so FSDP gathers the experts' shards first.
        out = experts(rows, received.sum(0), self.by_local_expert(received))
        return _AllToAll.apply(out, send_rows, recv_rows, group)

    def exchange_counts(self, counts: torch.Tensor) -> tuple[torch.Tensor, list[int], list[int]]:
        """(rows each peer sends me for each of my experts [peer, my expert], rows I send to
        each peer, rows each peer sends me) from my `counts` [num_experts]: step (1)."""
        sent = counts.view(dist.get_world_size(self.group), -1)  # [peer, its expert]: rows sent
        received = torch.empty_like(sent)  # [peer, my expert]: rows that peer sends me
        dist.all_to_all_single(received, sent.contiguous(), group=self.group)
        return received, sent.sum(1).tolist(), received.sum(1).tolist()

    def by_local_expert(self, received: torch.Tensor) -> torch.Tensor:
        """The order that sorts the received rows by local expert (`_by_local_expert`)."""
        return _by_local_expert(received)


def _local_experts(
    experts: nn.Module, x: torch.Tensor, counts: torch.Tensor, order: torch.Tensor
) -> torch.Tensor:
    """`GroupedExperts.forward` on this rank's slice of the experts (`counts` one per expert
    of it) over rows that `order` sorts by expert, returned in their own order; the slice's
    gradient goes back into the DTensor as its `Shard(0)` piece."""
    weights = (getattr(experts, name).to_local() for name in EXPERT_WEIGHTS)
    out = run_grouped_experts(x.index_select(0, order), counts, *weights)
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    return out.index_select(0, back)


def check_expert_parallel(
    model: nn.Module, ep: int, tp: int = 1, pp: int = 1, num_experts: int = 0
) -> None:
    """ValueError in one line unless `model` has our MoE layers (`models/moe.py`) for `ep`
    ranks to split: a Hugging Face MoE model has none of their seams. Such a model
    (`num_experts` from its description, no MoE layers of ours) is refused under `tp` or `pp`
    too: transformers' expert modules match no TP plan, and no pipeline cut of it is tested."""
    ours = bool(moe_layers(model))
    if num_experts and not ours:
        for name, degree in (("tp", tp), ("pp", pp)):
            if degree > 1:
                importable, advice = _import_advice(model, "runs under tp, pp and ep")
                raise ValueError(
                    f"strategy.{name}={degree} with a Hugging Face mixture of experts "
                    f"({type(model).__name__}, {num_experts} experts) is not supported: use "
                    f"dp_replicate and dp_shard"
                    + (f", or {advice}" if importable else f"; {advice}")
                )
    if ep > 1 and not ours:
        importable, advice = _import_advice(model, "ep splits")
        raise ValueError(
            f"strategy.ep={ep} splits the experts of our MoE layers (models/moe.py), and "
            f"{type(model).__name__} has none; "
            + (f"{advice}, or set strategy.ep=1" if importable else f"{advice}: set strategy.ep=1")
        )


def _import_advice(model: nn.Module, gain: str) -> tuple[bool, str]:
    """Whether `python -m lightning_dist.checkpoint import` can turn this Hugging Face model
    into our MoE model (which `gain`), and the advice that agrees with the import: how to, or,
    for an architecture it refuses, what our model lacks of it."""
    kind = getattr(model, "model_type", None)  # HFCausalLM's Hugging Face architecture
    if kind is None or kind in IMPORTABLE_MODEL_TYPES:
        return True, (f"import it into our MoE model, which {gain} (python -m "
                      "lightning_dist.checkpoint import DIR; train the checkpoint it writes with "
                      "trainer.init_from=... and the model overrides it prints)")  # fmt: skip
    lacks = NOT_IMPORTABLE.get(kind, "an architecture the import does not convert")
    return False, (
        f"model_type={kind} cannot be imported into our MoE model (ours has no "
        f"{lacks}; import converts {', '.join(IMPORTABLE_MODEL_TYPES)})"
    )


def apply_expert_parallel(model: nn.Module, ep_mesh) -> nn.Module:
    """Split each MoE layer's experts over the 1-D `ep_mesh` (DTensor `Shard(0)`; each rank
    keeps its slice of the full weights it holds, or allocates nothing on the meta device) and
    route the layer's tokens to them by all-to-all (`ExpertParallel`). Returns `model`."""
    from torch.distributed.tensor import Shard, distribute_tensor

    layers = moe_layers(model)
    for moe in layers:
        experts = moe.experts
        for name in EXPERT_WEIGHTS:
            param = getattr(experts, name)
            split = distribute_tensor(param, ep_mesh, [Shard(0)], src_data_rank=None)
            experts.register_parameter(name, nn.Parameter(split, requires_grad=param.requires_grad))
        experts.forward = partial(_local_experts, experts)
        moe.run_experts = ExpertParallel(ep_mesh.get_group())
    log.info("Applied expert parallelism: ep=%d, %d MoE layers", ep_mesh.size(), len(layers))
    return model


def apply_expert_fsdp(
    model: nn.Module,
    mesh,
    *,
    divide_factor: int,
    reshard_after_forward: bool | int = True,
    mp_policy=None,
    offload_policy=None,
) -> nn.Module:
    """Make each MoE layer's experts an FSDP2 unit of their own over `mesh`
    (`experts_fsdp_mesh`), sharded along dim 1, with gradients divided by `divide_factor` (the
    dense units' data-parallel size, module docs). Before `apply_fsdp`, which then leaves them
    out of the blocks' units. An integer `reshard_after_forward` (groups within dp_shard)
    becomes True.

    The division: over a shard group of several ranks, a sum and then a division, which every
    backend has (gloo has no pre-multiplied sum, which FSDP2 would use for a custom factor).
    Over a group of one rank (ep = dp_shard) FSDP2 (torch 2.13) divides while it copies, and
    would divide again after a sum-then-divide reduction: the plain setting divides once."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    options = {"mp_policy": mp_policy, "offload_policy": offload_policy}
    options = {k: v for k, v in options.items() if v is not None}
    reshard = reshard_after_forward if isinstance(reshard_after_forward, bool) else True
    alone = mesh.size(mesh.ndim - 1) == 1
    reduce_dtype = getattr(mp_policy, "reduce_dtype", None)
    if alone and reduce_dtype is not None and reduce_dtype == torch.float16:
        raise ValueError(
            "strategy.reduce_dtype=fp16 with ep = dp_shard: FSDP2 (torch 2.13) would divide "
            "the experts' gradients twice; use strategy.reduce_dtype=fp32 or bf16, or a smaller ep"
        )
    for moe in moe_layers(model):
        unit = fully_shard(
            moe.experts,
            mesh=mesh,
            reshard_after_forward=reshard,
            shard_placement_fn=lambda param: Shard(1),
            **options,
        )
        unit.set_gradient_divide_factor(float(divide_factor))
        if not alone:
            unit.set_force_sum_reduction_for_comms(True)
    return model


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 1 (the sequence) in rank order; backward: this rank's slice of the
    gradient, which every tp rank holds whole (the layer runs on the whole sequence on each)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group, ctx.local = group, x.size(1)
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        start = dist.get_rank(ctx.group) * ctx.local
        return grad.narrow(1, start, ctx.local).contiguous(), None


class _KeepShard(torch.autograd.Function):
    """This rank's slice along dim 1 of a whole-sequence tensor; backward: the all-gather of
    every rank's slice of the gradient, the whole gradient on each."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        local = x.size(1) // dist.get_world_size(group)
        return x.narrow(1, dist.get_rank(group) * local, local).contiguous()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _GatherSequence.forward(ctx, grad, ctx.group), None


def _gather_input(group, module: nn.Module, args: tuple) -> tuple:
    x = args[0]
    if hasattr(x, "to_local"):  # a sequence-parallel norm's DTensor output, Shard(1)
        x = x.to_local()
    return (_GatherSequence.apply(x, group), *args[1:])


def _keep_shard(group, module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
    return _KeepShard.apply(out, group)


def replicated_feed_forwards(model: nn.Module) -> list[nn.Module]:
    """The blocks' `feed_forward` modules that tensor parallelism left whole (an MoE model's
    plan splits none of them: `models.moe.MOE_TP_PLAN`)."""
    from torch.distributed.tensor import DTensor

    found = []
    for module in model.modules():
        ff = getattr(module, "feed_forward", None)
        if isinstance(ff, nn.Module) and not any(isinstance(p, DTensor) for p in ff.parameters()):
            found.append(ff)
    return found


def replicate_over_tp(model: nn.Module, tp_mesh, *, sequence_parallel: bool) -> nn.Module:
    """Run an MoE model's feed-forward layers whole on every rank of `tp_mesh` (module docs):
    under sequence parallelism on the gathered sequence, keeping this rank's shard of the
    output; without it they see the whole sequence already. Returns `model`."""
    if not sequence_parallel:
        return model
    group = tp_mesh.get_group()
    for module in replicated_feed_forwards(model):
        module.register_forward_pre_hook(partial(_gather_input, group))
        module.register_forward_hook(partial(_keep_shard, group))
    return model
