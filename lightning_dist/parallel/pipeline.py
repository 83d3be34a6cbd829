"""Pipeline parallelism on `torch.distributed.pipelining`: cut, build stages, run a schedule.

A model that keeps the pipeline-layers contract (`lightning_dist.models.protocol`) is cut into
`pp x virtual_stages` stages by contiguous block ranges: the embedding goes with the first stage,
the final norm and output with the last. Each rank keeps only its own stages (copies of the
model with every other block removed and the foreign ends set to None), so parameter names
stay those of the whole model.

The split is balanced by cost, or taken from user split points. A block's cost is its
parameter count, which tracks memory (weights, gradients, optimizer state) and, for matmul
layers, compute; the embedding and the output projection count towards the first and last
stage like blocks do.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable

import torch
from torch import nn

from lightning_dist._compat import module_internals, pipeline_action_types
from lightning_dist.layout import Layout, balanced_split  # noqa: F401 (re-exported)
from lightning_dist.models.moe import moe_layers, take_aux_loss
from lightning_dist.models.protocol import PipelineLayers

log = logging.getLogger(__name__)

SCHEDULE_MARKER = "lightning_dist::pipeline_schedule"
"""Profiler range around one training step's pipeline schedule (read by the comm telemetry)."""


def block_names(model: nn.Module) -> list[str]:
    """Names of the repeated blocks, in order (keys of the ModuleDict, indices of a ModuleList)."""
    container = model.get_submodule(model.pipeline_blocks)
    if isinstance(container, nn.ModuleDict):
        return list(container.keys())
    return [str(i) for i in range(len(container))]


def _numel(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def _cost_of(model: nn.Module, paths: tuple[str, ...]) -> int:
    return sum(_numel(_get(model, path)) for path in paths)


def split_blocks(
    model: nn.Module, num_stages: int, split_points: list[int] | None = None
) -> list[list[str]]:
    """The block names of each of `num_stages` stages, balanced or cut at `split_points`.

    `split_points` are the indices of the first block of stages 1..num_stages-1. Raises
    ValueError for a model without the pipeline-layers contract, fewer blocks than stages, or
    bad split points.
    """
    if not isinstance(model, PipelineLayers):
        raise ValueError(
            f"{type(model).__name__} does not expose its layers for pipeline parallelism: give it "
            "pipeline_blocks, pipeline_first and pipeline_last (see lightning_dist.models.protocol)"
        )
    _check_layer_paths(model)
    names = block_names(model)
    if len(names) < num_stages:
        raise ValueError(
            f"the model has {len(names)} layers, fewer than the {num_stages} pipeline stages "
            "(pp x virtual_stages)"
        )
    if split_points is None:
        blocks = model.get_submodule(model.pipeline_blocks)
        costs = [_numel(_child(blocks, name)) for name in names]
        costs[0] += _cost_of(model, tuple(model.pipeline_first))
        costs[-1] += _cost_of(model, tuple(model.pipeline_last))
        split_points = balanced_split(costs, num_stages)
    _check_split_points(split_points, len(names), num_stages)
    bounds = [0, *split_points, len(names)]
    return [names[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _check_layer_paths(model: nn.Module) -> None:
    """The pipeline attributes name real modules (one line naming the attribute if not)."""
    name, blocks = type(model).__name__, model.pipeline_blocks
    try:
        container = model.get_submodule(blocks)
    except AttributeError:
        raise ValueError(f"{name}.pipeline_blocks={blocks!r} is not a submodule path") from None
    if not isinstance(container, (nn.ModuleList, nn.ModuleDict)):
        raise ValueError(
            f"{name}.pipeline_blocks={blocks!r} is a {type(container).__name__}; it must name "
            "the nn.ModuleList (or nn.ModuleDict) of repeated blocks"
        )
    for attr in ("pipeline_first", "pipeline_last"):
        paths = getattr(model, attr)
        if isinstance(paths, str):
            raise ValueError(f"{name}.{attr} must be a tuple of module paths, e.g. ({paths!r},)")
        for path in paths:
            try:
                _get(model, path)
            except AttributeError:
                raise ValueError(f"{name}.{attr} names {path!r}, which the model lacks") from None


def _check_split_points(points: list[int], n_blocks: int, num_stages: int) -> None:
    points = list(points)
    if len(points) != num_stages - 1:
        raise ValueError(
            f"split_points={points} must have {num_stages - 1} entries for {num_stages} stages"
        )
    if points != sorted(set(points)) or (points and not 0 < points[0] <= points[-1] < n_blocks):
        raise ValueError(
            f"split_points={points} must be increasing layer indices between 1 and {n_blocks - 1}"
        )


class StageBlocks(nn.ModuleDict):
    """The blocks a pipeline stage keeps of a model's `nn.ModuleList`, used like that list.

    The blocks stay keyed by their index in the whole model, so parameter names and state_dict
    keys do not change (`layers.2.attn.q.weight` on the stage that holds block 2). A forward
    written for the ModuleList runs unchanged: iterating yields the blocks in order, `len()`
    counts them, and `blocks[i]` (or a slice) is the i-th block this stage holds. The
    ModuleDict API remains: `keys()` are the original indices, `blocks["2"]` is block 2.
    """

    def __iter__(self):
        return iter(self._children().values())

    def __getitem__(self, key):
        children = self._children()
        if isinstance(key, str):
            return children[key]
        if isinstance(key, slice):
            return nn.ModuleList(list(children.values())[key])
        return list(children.values())[key]

    def __contains__(self, item) -> bool:
        children = self._children()
        if isinstance(item, str):
            return item in children
        return any(item is block for block in children.values())

    def _children(self) -> dict:
        # ModuleDict's own registry: this class redefines the dict API ModuleDict would read it by.
        return module_internals(self).modules


def cut_stage(model: nn.Module, blocks: list[str], *, first: bool, last: bool) -> nn.Module:
    """Keep `blocks` (and the first/last modules where asked) of `model`, in place.

    The kept blocks replace the container at `pipeline_blocks`: a `StageBlocks` when it was a
    ModuleList (iterates like one), a ModuleDict of the kept keys when it was a ModuleDict.
    """
    container = model.get_submodule(model.pipeline_blocks)
    kind = StageBlocks if isinstance(container, nn.ModuleList) else nn.ModuleDict
    kept = kind({name: _child(container, name) for name in blocks})
    _set(model, model.pipeline_blocks, kept)
    dropped = (() if first else tuple(model.pipeline_first)) + (
        () if last else tuple(model.pipeline_last)
    )
    for path in dropped:
        _set(model, path, None)
    return model


def stage_modules(
    model: nn.Module, layout: Layout, pp_rank: int, split_points: list[int] | None = None
) -> list[tuple[int, nn.Module]]:
    """(stage index, stage module) for each stage `pp_rank` holds, cut from `model`."""
    plan = split_blocks(model, layout.num_stages, split_points)
    ids = layout.stage_ids(pp_rank)
    parts = []
    for k, stage in enumerate(ids):
        # The last stage of this rank reuses the model itself; the others are copies.
        part = model if k == len(ids) - 1 else copy.deepcopy(model)
        cut_stage(part, plan[stage], first=stage == 0, last=stage == layout.num_stages - 1)
        parts.append((stage, part))
    log.info(
        "Pipeline rank %d holds stages %s with layers %s",
        pp_rank,
        ids,
        [plan[s] for s in ids],
    )
    return parts


def build_schedule(stages: list, layout: Layout, loss_fn: Callable):
    """The torch schedule of `layout.schedule` over this rank's `PipelineStage`s.

    Gradients are not rescaled by the schedule (`scale_grads=False`): `loss_fn` divides each
    microbatch's loss itself, which also stays right under gradient accumulation. Keyword
    inputs of the stages (`positions`, `documents`) are cut along the batch like the tokens.
    """
    from torch.distributed.pipelining import schedules

    cls = schedules.get_schedule_class(layout.schedule)
    single = issubclass(cls, schedules.PipelineScheduleSingle)
    return cls(
        stages[0] if single else stages,
        n_microbatches=layout.num_microbatches,
        loss_fn=loss_fn,
        scale_grads=False,
    )


def _stage_class(*, experts: bool, in_flight: bool):
    """The stage class: `InFlightStage` (`parallel/pipeline_stage.py`) or torch's own
    `PipelineStage` (`in_flight=False`), with, for a mixture of experts, layers that record
    their loads and auxiliary losses in the microbatches' forwards only: torch 2.13 runs each
    stage once more, on the first step and after each switch between training and evaluation,
    on empty tensors to learn the shapes it sends (its dynamic metadata inference, which calls
    the module outside `forward_one_chunk`); that run must not count."""
    from torch.distributed.pipelining import PipelineStage

    from lightning_dist.parallel.pipeline_stage import InFlightStage

    base = InFlightStage if in_flight else PipelineStage
    if not experts:
        return base

    class Stage(base):  # type: ignore[misc,valid-type]
        def forward_one_chunk(self, *args, **kwargs):
            layers = moe_layers(self.submod)
            for m in layers:
                m.recording = True
            try:
                return super().forward_one_chunk(*args, **kwargs)
            finally:
                for m in layers:
                    m.recording = False

    return Stage


class PipelinedModel(nn.Module):
    """This rank's pipeline stages and the schedule that runs them.

    `model(inputs, target, loss_fn)` runs every microbatch through the pipeline: forward and
    backward when gradients are enabled (training), forward only otherwise (validation). It
    returns the mean loss over the microbatches on every rank of the pipeline, not just the last
    stage. Gradients are left in the stages' parameters, so the caller must not call backward.

    A mixture of experts' load-balancing loss is added to the backward by each MoE layer
    itself (`MoE.aux_grad_scale`, set here to one microbatch's weight in the step), since only
    the last stage computes a loss; its value, the mean over microbatches summed over every
    stage's layers, is `take_aux_loss()`'s after a training step.
    """

    computes_loss = True

    def __init__(
        self,
        parts: list[tuple[int, nn.Module]],
        layout: Layout,
        pp_group,
        device,
        *,
        experts: bool = False,
        in_flight_only: bool = True,
    ):
        """`experts`: the whole model is a mixture of experts (this rank's stages may hold none
        of its MoE layers, `first_k_dense`, but take part in summing their losses).
        `in_flight_only=False` runs torch's own `PipelineStage`, which keeps every microbatch's
        receive buffers (bench/pipeline_memory.py measures the difference)."""
        super().__init__()

        self.stage_ids = [stage for stage, _ in parts]
        self.parts = nn.ModuleList([part for _, part in parts])
        self.num_microbatches = layout.num_microbatches
        self.is_first = 0 in self.stage_ids
        self.is_last = layout.num_stages - 1 in self.stage_ids
        self.grad_accumulation = 1
        """Lightning's gradient accumulation; the strategy sets it before each step."""
        self._pp_group = pp_group
        self._loss_fn: Callable | None = None
        self.mixture_of_experts = experts
        """Whether the whole model is a mixture of experts (`experts`)."""
        self._experts = [m for _, part in parts for m in moe_layers(part)]
        for m in self._experts:
            m.recording = False  # on in each microbatch's forward only (`_stage_class`)
        self._aux_loss: torch.Tensor | None = None
        stage = _stage_class(experts=bool(self._experts), in_flight=in_flight_only)
        self.stages = [
            stage(part, index, layout.num_stages, device, group=pp_group) for index, part in parts
        ]
        """This rank's torch `PipelineStage`s, in `stage_ids` order."""
        from lightning_dist.parallel.pipeline_stage import link_stages

        link_stages(self.stages)
        self.schedule = build_schedule(self.stages, layout, self._microbatch_loss)

    def _loss_scale(self) -> int:
        # Each microbatch is 1/num_microbatches of the batch, and each accumulation step
        # 1/grad_accumulation of the optimizer step: the summed gradients are then the mean's.
        return self.num_microbatches * self.grad_accumulation

    def _microbatch_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self._loss_fn(output, target) / self._loss_scale()

    def forward(
        self,
        inputs: torch.Tensor,
        target: torch.Tensor,
        loss_fn: Callable,
        positions: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the batch `inputs` through the pipeline; `loss_fn(output, target)` gives the mean
        loss of one microbatch on the last stage. Returns the batch's mean loss (no grad).
        `positions` (the tokens' rotary positions: [s] or [b, s]) and `documents` (packed
        documents' ids, [b, s]) go to every stage, each microbatch its rows."""
        import torch.distributed as dist

        self._loss_fn = loss_fn
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.is_first else ()
        target = target if self.is_last else None
        extra = {}
        if positions is not None:  # one row per sequence, so the schedule cuts it by rows
            extra["positions"] = positions.expand(inputs.size(0), -1).contiguous()
        if documents is not None:
            extra["documents"] = documents
        training = torch.is_grad_enabled()
        for m in self._experts:
            m.aux_grad_scale = 1.0 / self._loss_scale()
        # return_outputs=False: the losses are all we read. With torch's default the last stage
        # keeps every microbatch's output, the logits, until the step ends (m x mbs x s x V / tp
        # elements: 8 GiB in bf16 on Llama 3 405B's last stage at 8 microbatches of 4 x 8192).
        if training:
            # The marker lets the telemetry measure the bubble of the schedule alone.
            with torch.profiler.record_function(SCHEDULE_MARKER):
                self.schedule.step(
                    *args, target=target, losses=losses, return_outputs=False, **extra
                )
        else:
            with _forward_actions_only(self.schedule):
                self.schedule.eval(
                    *args, target=target, losses=losses, return_outputs=False, **extra
                )
        if self.is_last:
            # A loss-parallel cross-entropy gives replicated DTensors; keep the plain values.
            values = [t.full_tensor() if hasattr(t, "full_tensor") else t for t in losses]
            loss = torch.stack([t.detach().float() for t in values]).sum() * self.grad_accumulation
        else:
            loss = torch.zeros((), device=inputs.device)
        if not (training and self.mixture_of_experts):
            # Only the last stage has the loss; a sum over the pipeline ranks gives it to all.
            dist.all_reduce(loss, group=self._pp_group)
            return loss
        # Each stage's load-balancing losses (summed over microbatches): their mean over
        # microbatches, summed over the stages, rides along.
        aux = take_aux_loss(self._experts)
        aux = torch.zeros((), device=loss.device) if aux is None else aux.to(loss.device)
        both = torch.stack([loss.float(), aux.float() / self.num_microbatches])
        dist.all_reduce(both, group=self._pp_group)
        self._aux_loss = both[1]
        return both[0].to(loss.dtype)

    def take_aux_loss(self) -> torch.Tensor | None:
        """The last training step's load-balancing loss over the whole pipeline (the mean over
        its microbatches, summed over every stage's MoE layers; a detached value, the same on
        every pipeline rank), or None; it is already in the gradients."""
        aux, self._aux_loss = self._aux_loss, None
        return aux


@contextlib.contextmanager
def _forward_actions_only(schedule):
    """Run a multi-stage schedule's `eval()` on its forward actions alone.

    torch 2.13 runs the backward actions of the action list in eval too (as no-ops), but for a
    V-shaped schedule (ZBVZeroBubble) the hand-over of input gradients between two stages of
    one rank asserts that a backward ran. Dropping the backward actions keeps the forward
    sends and receives paired, so the forward-only run cannot deadlock.
    """
    order = getattr(schedule, "pipeline_order_with_comms", None)
    if order is None:  # a single-stage schedule: its eval() is fine
        yield
        return
    C = pipeline_action_types()

    keep = {C.FORWARD, C.SEND_F, C.RECV_F, C.UNSHARD, C.RESHARD}
    schedule.pipeline_order_with_comms = {
        rank: [a for a in actions if a is not None and a.computation_type in keep]
        for rank, actions in order.items()
    }
    try:
        yield
    finally:
        schedule.pipeline_order_with_comms = order


def _get(model: nn.Module, path: str) -> nn.Module | None:
    parent, _, leaf = path.rpartition(".")
    return getattr(model.get_submodule(parent) if parent else model, leaf)


def _set(model: nn.Module, path: str, value: nn.Module | None) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, value)


def _child(container: nn.Module, name: str) -> nn.Module:
    return container[name] if isinstance(container, nn.ModuleDict) else container[int(name)]
