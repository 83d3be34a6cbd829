"""Memory of one training step by category: parameters, gradients, optimizer state,
activations and temporaries, per rank. No Lightning import: the telemetry and the planner use it.

Two measurements are combined, each where it is exact:

- **model state** (params, grads, optimizer) is what persists between steps. It is read after
  the optimizer step from the tensors themselves, counting each storage once and only the local
  shard of a DTensor or FSDP flat parameter. This is the number that sharding divides.
- **activations** (their high-water mark) and the step's **peak** (`total`) come from torch's
  `MemTracker`, a dispatch mode that sees every allocation during the step. `temps` is the rest
  of the peak: gathered (unsharded) parameters, communication buffers, backward and optimizer
  temporaries, buffers.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from lightning_dist._compat import (
    MemTrackerHooks,
    in_backward,
    mem_tracker_class,
    mem_tracker_current,
    mem_tracker_enter_optimizer,
    mem_tracker_replace_module_hooks,
)

CATEGORIES = ("params", "grads", "optimizer", "activations", "temps", "total")


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def storage_bytes(
    tensors: Iterable[torch.Tensor | None], device: torch.device | None = None
) -> int:
    """Bytes of the distinct storages behind `tensors` (views share one), on `device` if given."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        t = _local(t)
        if device is not None and t.device.type != device.type:
            continue
        storage = t.untyped_storage()
        seen[storage.data_ptr() or id(storage)] = storage.nbytes()
    return sum(seen.values())


def model_state_bytes(
    model: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    device: torch.device | None = None,
) -> dict[str, int]:
    """{params, grads, optimizer}: bytes this rank holds for the model state right now."""
    params = list(model.parameters())
    state = [v for opt in optimizers for s in opt.state.values() for v in s.values()]
    return {
        "params": storage_bytes(params, device),
        "grads": storage_bytes((p.grad for p in params), device),
        "optimizer": storage_bytes((v for v in state if isinstance(v, torch.Tensor)), device),
    }


class _NoModuleHooks:
    """Stands in for MemTracker's ModTracker when module hooks cannot be used: a pipeline stage
    runs its modules once per microbatch, and its schedule runs backward inside the root
    module's forward, both of which break the module hierarchy the hooks keep. Without them a
    tensor is an activation when created outside backward and the optimizer step, a temporary
    inside backward (gradients included; the model state is counted from the tensors anyway)."""

    parents = frozenset({"Global"})

    @property
    def is_bw(self) -> bool:
        return in_backward()

    def register_user_hooks(self, *hooks) -> None:
        pass

    def clear_user_hooks(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *args) -> None:
        pass


def _tracker_class(optimizer_hooks: bool, module_hooks: bool = True):
    MemTracker = mem_tracker_class()

    class Tracker(MemTrackerHooks, MemTracker):
        def __init__(self) -> None:
            super().__init__()
            if not module_hooks:
                mem_tracker_replace_module_hooks(self, _NoModuleHooks())

        # The tracker counts everything after `optimizer.step()` begins as optimizer state. A
        # closure-style step (Lightning's) runs forward and backward inside it, so there the
        # caller marks the optimizer's own part with `StepMemoryMeter.optimizer_step_begins`.
        def register_optimizer_hooks(self):
            if optimizer_hooks:
                super().register_optimizer_hooks()

        # The peak snapshot holds the activations alive at the peak, which is 0 when the peak is
        # in the optimizer step; their own high-water mark is the number that matters.
        def update_peak_stats(self, peak_state):
            super().update_peak_stats(peak_state)
            for dev, snap in mem_tracker_current(self).items():
                act = sum(v for k, v in snap.items() if getattr(k, "value", k) == "Activation")
                self.peak_activations[dev] = max(self.peak_activations.get(dev, 0), act)

        # FSDP1 swaps parameters for non-leaf views while a unit is gathered, and gradient hooks
        # cannot be registered on those; gradients are counted from the tensors instead.
        def track_module_params_and_buffers(self, module, install_grad_hooks=True):
            if all(p.is_leaf for p in module.parameters()):
                return super().track_module_params_and_buffers(module, install_grad_hooks)
            with warnings.catch_warnings():  # it reads `.grad` of those views
                warnings.simplefilter("ignore", UserWarning)
                return super().track_module_params_and_buffers(module, False)

    return Tracker


class StepMemoryMeter:
    """Measures one step: `start(model, optimizers)` before it, `stop()` after the optimizer
    step. The step may span hooks or callbacks (the tracker is a context entered in `start`).
    `module_hooks=False` measures a pipeline stage (see `_NoModuleHooks`).

    With `closure_step=True` (the optimizer runs forward and backward inside `step(closure)`),
    call `optimizer_step_begins()` once backward is done.
    """

    def __init__(
        self,
        device: torch.device | None = None,
        *,
        closure_step: bool = False,
        module_hooks: bool = True,
    ) -> None:
        self.device = device
        self.closure_step = closure_step
        self.module_hooks = module_hooks
        self._tracker = None
        self._model: nn.Module | None = None
        self._optimizers: Sequence[torch.optim.Optimizer] = ()

    def start(
        self,
        model: nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        *,
        external: Iterable[torch.Tensor] = (),
    ) -> None:
        """Begin tracking; tensors that exist already (weights, optimizer state, and `external`:
        other tensors the step keeps, e.g. a pipeline stage's buffers) are counted."""
        self._model, self._optimizers = model, list(optimizers)
        self._tracker = _tracker_class(not self.closure_step, self.module_hooks)()
        self._tracker.peak_activations = {}
        self._tracker.track_external(model, *self._optimizers, *external)
        self._tracker.__enter__()

    def optimizer_step_begins(self) -> None:
        """From here on, new tensors are optimizer state or its temporaries."""
        if self._tracker is not None:
            mem_tracker_enter_optimizer(self._tracker)

    def stop(self) -> dict[str, int]:
        """End tracking and return bytes by category (see `CATEGORIES`)."""
        tracker, self._tracker = self._tracker, None
        if tracker is None:
            raise RuntimeError("StepMemoryMeter.stop() without start()")
        tracker.__exit__(None, None, None)
        peak = self._device_snapshot(tracker.get_tracker_snapshot("peak"))
        result = model_state_bytes(self._model, self._optimizers, self.device)
        model_state = sum(result.values())
        total = max(peak.get("Total", 0), model_state)
        result["activations"] = sum(
            v for dev, v in tracker.peak_activations.items() if self._on_device(dev)
        )
        result["temps"] = max(0, total - model_state - result["activations"])
        result["total"] = total
        return result

    def _on_device(self, dev) -> bool:
        return self.device is None or torch.device(dev).type == self.device.type

    def _device_snapshot(self, snapshot: dict) -> dict[str, int]:
        merged: dict[str, int] = {}
        for dev, categories in snapshot.items():
            if not self._on_device(dev):
                continue
            for key, value in categories.items():
                name = getattr(key, "value", key)
                merged[name] = merged.get(name, 0) + value
        return merged


def measure_step(
    step: Callable[[], object],
    model: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    device: torch.device | None = None,
) -> dict[str, int]:
    """Run `step()` (forward, backward, optimizer step) once and return its memory by category."""
    meter = StepMemoryMeter(device)
    meter.start(model, optimizers)
    try:
        step()
    finally:
        result = meter.stop()
    return result
