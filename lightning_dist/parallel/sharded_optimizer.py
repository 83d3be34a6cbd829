"""ZeRO-1: the optimizer states sharded over the data-parallel ranks, parameters and gradients
replicated (`strategy.shard_optimizer`, under `strategy=ddp` and the mesh strategies'
`dp_replicate`), as Megatron's distributed optimizer and DeepSpeed's BF16 optimizer run it.

`ShardedOptimizer(optimizer, group)` wraps a torch optimizer whose update is elementwise (AdamW,
Adam, SGD, ...). Each parameter group lies flat over the dp ranks of `group`, this rank owning
one contiguous slice of it (`parallel/flat_shards.py`). A step:

1. reads this rank's slice of the parameters, and of their gradients: with
   `reduce_gradients=True` (the strategies' ZeRO-1) each rank's own gradients reduce-scattered
   into the mean of its slice (`parallel/gradient_reduction.py`: no all-reduce ran before),
   else read from gradients that are whole and alike on every rank already;
2. runs the wrapped optimizer's class on that flat slice only, so its states hold chunk
   elements per group instead of N: 1/dp of the unsharded optimizer's, up to the padding of the
   last shard;
3. all-gathers the updated slices over `group` (`GATHER_ELEMENTS` at a time) and writes them
   back into every parameter.

Because the update is elementwise, each element sees exactly the arithmetic it would see on one
process. With the reduce-scatter a step moves the bytes of one all-reduce (`planner/traffic.py`
counts the same); it runs after the last backward, not overlapped with it, when the step or
clipping (`clip_grad_norm_`: the owned slices and one scalar all-reduce) asks first;
`param.grad` stays this rank's unreduced gradient.

The parameter groups are the wrapped optimizer's own dicts, so its learning-rate scheduler
steers the shards. A parameter without a gradient in a step keeps its value and its states, as
torch's optimizers skip it (a group where no parameter has one is not stepped at all: the NaN
guard's skipped steps); one difference stays: a group's step count is shared, so a parameter
that missed some of its group's steps is bias-corrected by the group's count. Frozen parameters
handed to the optimizer are never updated but do get states. `state_dict()` gathers every
state whole (a temporary spike of the unsharded optimizer's size) so checkpoints are exactly
what the unsharded optimizer writes, and any layout reads them; `load_state_dict()` keeps this
rank's slice. No Lightning import here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from lightning_dist._compat import all_gather_single
from lightning_dist.parallel.clip import copies_of
from lightning_dist.parallel.flat_shards import FlatGroup, lay_flat, piece_like
from lightning_dist.parallel.gradient_reduction import (
    clip_by_norm_,
    local_tensor,
    reduce_scatter_mean,
    write_parameters,
)

ELEMENTWISE_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD, torch.optim.Adamax,
    torch.optim.RMSprop, torch.optim.NAdam, torch.optim.RAdam,
)  # fmt: skip
"""The optimizers whose update of each element reads only that element's parameter, gradient
and state, and whose states start at zero on the first step: the ones a slice of the flat
parameters can step alone. (Adagrad is elementwise too, but makes its whole states when it is
built, so wrapping it would save nothing.)"""


GATHER_ELEMENTS = 1 << 25
"""Elements one all-gather of the step brings back (all ranks' pieces together): 128 MiB of
fp32, the most the step holds beside the parameters, gradients and states."""


class ShardedOptimizer(torch.optim.Optimizer):
    """`optimizer` with its states sharded over the ranks of `group` (None: the default group);
    see the module's docstring. Every rank of `group` must hold the same parameters (shapes) and,
    at each step the same gradients, or with `reduce_gradients` its own gradients of the same
    parameters (None alike on every rank), which the step averages over `group` by a
    reduce-scatter. Raises ValueError for an optimizer whose update is not elementwise, or a
    parameter group that mixes dtypes or devices."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, group: Any = None, *, reduce_gradients: bool = False
    ) -> None:
        if type(optimizer) not in ELEMENTWISE_OPTIMIZERS:
            names = ", ".join(cls.__name__ for cls in ELEMENTWISE_OPTIMIZERS)
            raise ValueError(
                f"strategy.shard_optimizer=true shards elementwise optimizers ({names}), not "
                f"{type(optimizer).__name__}; set strategy.shard_optimizer=false"
            )
        self.wrapped = optimizer
        self.process_group = group
        self.dp_size = dist.get_world_size(group)
        self.dp_rank = dist.get_rank(group)
        self.reduces_gradients = reduce_gradients
        self._reduced = False
        """Whether this step's gradients are reduce-scattered into the shards' `.grad` yet."""
        self._present: list[list[bool]] | None = None
        """Per group, whether each parameter has a gradient on any replica (`_agree_present`)."""
        # The wrapped optimizer's group dicts themselves (torch's __init__ appends them), so a
        # scheduler built on either optimizer sets the learning rate both step with.
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self.flat = [self._lay_flat(g) for g in self.param_groups]
        elementwise: Any = type(optimizer)  # one of ELEMENTWISE_OPTIMIZERS: groups suffice
        self.inner = elementwise(
            [{**self._settings(f.group), "params": [f.shard]} for f in self.flat]
        )

    def _lay_flat(self, group: dict[str, Any]) -> FlatGroup:
        return lay_flat(group, self.dp_size, self.dp_rank, self._any_parameter_kind())

    def _any_parameter_kind(self) -> tuple[torch.dtype, torch.device]:
        """An empty group's shard: on the device of the optimizer's parameters (NCCL gathers
        only device tensors), fp32."""
        for group in self.wrapped.param_groups:
            for param in group["params"]:
                return torch.float32, local_tensor(param).device
        return torch.float32, torch.device("cpu")

    @staticmethod
    def _settings(group: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in group.items() if k != "params"}

    # --- the step ---------------------------------------------------------------------------

    @torch.no_grad()
    def _read_slices(self) -> list[torch.Tensor | None]:
        """This rank's slice of the parameters and gradients into each group's shard; per group,
        the mask of the shard's elements whose parameter has no gradient (None when all have
        one). A group where no parameter has a gradient gets none: the inner step skips it."""
        without: list[torch.Tensor | None] = []
        for index, (flat, inner_group) in enumerate(
            zip(self.flat, self.inner.param_groups, strict=True)
        ):
            inner_group.update(self._settings(flat.group))  # the scheduler's learning rate
            reduced = self.reduces_gradients
            if self._present is not None:  # reduce_gradients ran: the replicas agreed
                missing = [not has for has in self._present[index]]
            else:  # alike on every rank: the gradients were all-reduced
                missing = [p.grad is None for p in flat.params]
            stepped = not all(missing)
            grad = torch.zeros_like(flat.shard) if stepped and not reduced else flat.shard.grad
            mask = torch.zeros_like(flat.shard, dtype=torch.bool) if any(missing) else None
            absent = {id(p) for p, gone in zip(flat.params, missing, strict=True) if gone}
            for param, (a, b), (s, t) in flat.pieces():
                flat.shard[s:t] = local_tensor(param).reshape(-1)[a:b]
                if id(param) in absent and mask is not None:
                    mask[s:t] = True
                elif grad is not None and not reduced and param.grad is not None:
                    grad[s:t] = local_tensor(param.grad).reshape(-1)[a:b]
            flat.shard.grad = grad
            without.append(mask if stepped else None)
        return without

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """With `reduce_gradients`: this step's gradients reduce-scattered, each group's owned
        slice of their mean into its shard's `.grad` (None for a group where no parameter has a
        gradient); once per step, whoever asks first (clipping or the step). A collective."""
        if not self.reduces_gradients or self._reduced:
            return
        self._present = self._agree_present()
        for flat, present in zip(self.flat, self._present, strict=True):
            stepped = any(present)  # agreed: every replica calls the reduce-scatter or none
            grad = torch.empty_like(flat.shard, requires_grad=False) if stepped else None
            if grad is not None:
                reduce_scatter_mean(flat.params, flat.offsets, grad, group=self.process_group)
            flat.shard.grad = grad
        self._reduced = True

    def _agree_present(self) -> list[list[bool]]:
        """Per group, whether each parameter has a gradient on any replica: one small
        all-reduce. A parameter unused on one replica (FSDP2 leaves its gradient None there,
        where DDP fills zeros) is then reduced with zeros from it and stepped everywhere, not
        half-stepped by the replicas that own its other elements."""
        local = [p.grad is not None for flat in self.flat for p in flat.params]
        if dist.get_backend(self.process_group) == "fake":  # the dry run: one rank, no values
            return self._split(local)
        flags = torch.tensor(local, dtype=torch.uint8, device=self._any_parameter_kind()[1])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.process_group)
        return self._split([bool(f) for f in flags.tolist()])

    def _split(self, flags: list[bool]) -> list[list[bool]]:
        """Per-parameter flags in the flat order, cut per group."""
        per_group, at = [], 0
        for flat in self.flat:
            per_group.append(flags[at : at + len(flat.params)])
            at += len(flat.params)
        return per_group

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, *, stage_size: int) -> torch.Tensor:
        """Scale the reduced gradient so that the whole model's norm is at most `max_norm`
        (torch's scale, max_norm / (norm + 1e-6) capped at 1); return that norm. `stage_size`:
        the ranks that hold one pipeline stage (dp x cp x tp), as `parallel/clip.py` takes it;
        the norm comes from the owned slices and one scalar all-reduce over the world."""
        self.reduce_gradients()
        pieces = [
            (flat.shard.grad[s:t], copies_of(param, stage_size) // self.dp_size)
            for flat in self.flat
            if flat.shard.grad is not None
            for param, _, (s, t) in flat.pieces()
        ]
        grads = [f.shard.grad for f in self.flat if f.shard.grad is not None]
        device = self.flat[0].shard.device if self.flat else torch.device("cpu")
        return clip_by_norm_(grads, pieces, max_norm, device)

    @torch.no_grad()
    def clip_grad_value_(self, clip_value: float) -> None:
        """Clamp the reduced gradient's elements to [-clip_value, clip_value]."""
        self.reduce_gradients()
        for flat in self.flat:
            if flat.shard.grad is not None:
                flat.shard.grad.clamp_(-clip_value, clip_value)

    @torch.no_grad()
    def _step_keeping(self, without: list[torch.Tensor | None]) -> None:
        """The inner step; the elements of parameters without a gradient get back the value and
        states they had (zero states where the step made them)."""
        kept = []
        for flat, mask in zip(self.flat, without, strict=True):
            if mask is None:
                continue
            before = self.inner.state.get(flat.shard, {})
            states = {n: v[mask].clone() for n, v in before.items() if self._elementwise(flat, v)}
            kept.append((flat, mask, flat.shard[mask].clone(), states))
        self.inner.step()
        for flat, mask, value, states in kept:
            flat.shard[mask] = value
            for name, state in self.inner.state[flat.shard].items():
                if self._elementwise(flat, state):
                    state[mask] = states[name] if name in states else 0

    @torch.no_grad()
    def _write_back(self) -> None:
        """All-gather the updated slices, `GATHER_ELEMENTS` at a time (so the step holds a
        bounded buffer, not a copy of the whole group), into every parameter."""
        for flat in self.flat:
            chunk = flat.stop - flat.start
            length = max(1, GATHER_ELEMENTS // self.dp_size)
            for i in range(0, chunk, length):
                j = min(chunk, i + length)
                gathered = self._gather(flat.shard.detach()[i:j])
                for rank in range(self.dp_size):
                    values = gathered[rank * (j - i) : (rank + 1) * (j - i)]
                    write_parameters(flat.params, flat.offsets, rank * chunk + i, values)
            flat.shard.grad = None

    def _gather(self, shard: torch.Tensor) -> torch.Tensor:
        whole = shard.new_empty(shard.numel() * self.dp_size)
        all_gather_single(whole, shard.contiguous(), group=self.process_group)
        return whole

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Run `closure` (Lightning's: forward, backward, clipping), then the sharded update."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce_gradients()
        self._step_keeping(self._read_slices())
        self._write_back()
        self._reduced, self._present = False, None
        self._expose_state()
        self._step_wrapped_without_gradients()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The parameters' gradients, and any reduced slice of them not yet stepped."""
        super().zero_grad(set_to_none)
        for flat in self.flat:
            flat.shard.grad = None
        self._reduced = False

    def _step_wrapped_without_gradients(self) -> None:
        """The wrapped optimizer's own step with every gradient hidden: it updates nothing
        (torch's optimizers skip a parameter without one), but a scheduler built on it (as
        `configure_optimizers` builds them) sees the step it expects before its own."""
        grads = [(p, p.grad) for group in self.param_groups for p in group["params"]]
        for param, _ in grads:
            param.grad = None
        try:
            self.wrapped.step()
        finally:
            for param, grad in grads:
                param.grad = grad

    def _expose_state(self) -> None:
        """`state[p]`: the part of p's state this rank holds (flat views; empty where p lies in
        another rank's slice), so code that reads `optimizer.state` sees real names and bytes."""
        self.state.clear()
        for flat in self.flat:
            held = self.inner.state.get(flat.shard, {})
            for param, offset in zip(flat.params, flat.offsets, strict=True):
                n = local_tensor(param).numel()
                a, b = max(offset, flat.start) - flat.start, min(offset + n, flat.stop) - flat.start
                self.state[param] = {
                    name: value[a : max(a, b)] if self._elementwise(flat, value) else value
                    for name, value in held.items()
                }

    @staticmethod
    def _elementwise(flat: FlatGroup, value: Any) -> bool:
        return torch.is_tensor(value) and value.shape == flat.shard.shape

    def local_state_bytes(self) -> int:
        """Bytes of the per-element optimizer states this rank holds (scalars such as Adam's
        step count aside): chunk x element size per state and group."""
        return sum(
            value.numel() * value.element_size()
            for flat in self.flat
            for value in self.inner.state.get(flat.shard, {}).values()
            if self._elementwise(flat, value)
        )

    # --- checkpoints: the unsharded optimizer's state dict ----------------------------------

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The state dict the unsharded optimizer would return (collective over the group):
        every state gathered whole, shaped like its parameter (a DTensor like it)."""
        state: dict[int, dict[str, Any]] = {}
        groups, index = [], 0
        for flat in self.flat:
            held = self.inner.state.get(flat.shard, {})
            whole = {n: self._gather(v) for n, v in held.items() if self._elementwise(flat, v)}
            ids = []
            for param, offset in zip(flat.params, flat.offsets, strict=True):
                if held:
                    state[index] = {
                        name: piece_like(param, whole[name], offset)
                        if name in whole
                        else value.clone()
                        for name, value in held.items()
                    }
                ids.append(index)
                index += 1
            groups.append({**self._settings(flat.group), "params": ids})
        return {"state": state, "param_groups": groups}

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Take this rank's slice of an unsharded optimizer's state dict (any layout's, read
        whole or as this rank's DTensor pieces); the groups' settings replace the current."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.flat):
            raise ValueError(
                f"the saved optimizer has {len(saved_groups)} parameter groups, this one "
                f"{len(self.flat)}; resume with the configure_optimizers that saved it"
            )
        for flat, saved in zip(self.flat, saved_groups, strict=True):
            flat.group.update(self._settings(saved))
            entries = [state_dict["state"].get(key) for key in saved["params"]]
            if len(entries) != len(flat.params):
                raise ValueError(
                    f"a saved optimizer group has {len(entries)} parameters, this one "
                    f"{len(flat.params)}; resume with the model and configure_optimizers that "
                    "saved it"
                )
            if not any(entries):
                continue
            first = next(e for e in entries if e)
            held: dict[str, Any] = {}
            for name, value in first.items():
                if not (torch.is_tensor(value) and value.dim() > 0):
                    held[name] = value.clone() if torch.is_tensor(value) else value
                    continue
                buffer = torch.zeros_like(flat.shard, requires_grad=False)
                for (param, (a, b), (s, t)), entry in flat.pieces_with(entries):
                    whole = local_tensor(entry[name])
                    if whole.numel() != local_tensor(param).numel():
                        raise ValueError(
                            f"the saved optimizer state {name!r} has {whole.numel()} elements "
                            f"here, its parameter {local_tensor(param).numel()}: read it through "
                            "the checkpoint loader, which reshards it to this layout"
                        )
                    source = whole.reshape(-1)[a:b]
                    buffer[s:t] = source.to(buffer.device, buffer.dtype)
                held[name] = buffer
            self.inner.state[flat.shard] = held
        self._expose_state()
