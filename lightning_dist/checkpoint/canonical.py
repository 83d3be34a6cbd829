"""The single-device names of a parallelised model, whatever its layout.

DCP's `get_model_state_dict` already drops the names that FSDP, activation checkpointing and
torch.compile insert. What it cannot see through is a pipeline: a rank holds its stages as
`parts.<k>` of a `PipelinedModel`, each a copy of the model with the other stages' modules
removed. `canonical_module` builds a view (new container modules, the same parameters) in which
each rank's stages sit where they sit in the whole model, so `layers.5.attention.wq.weight` has
that name on every layout and DCP can move it between stage counts and schedules.

A fused projection split by tensor parallelism is held by parts, [n, O, in] for the
single-device [n * O, in] (`parallel/fused.py`); `single_device_state` gives the files that
shape and order.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from lightning_dist._compat import module_internals
from lightning_dist.parallel.fused import fused_layers, single_device_view

WRAPPER_SEGMENTS = re.compile(
    r"(_fsdp_wrapped_module|_checkpoint_wrapped_module|_orig_mod)\.|^parts\.\d+\."
)
"""Name segments that FSDP1, activation checkpointing and torch.compile insert into parameter
names, and the `parts.<i>.` prefix of a pipeline stage (PipelinedModel): removed, the name is
the single-device model's."""


def canonical_module(root: nn.Module, pipeline: nn.Module | None = None) -> nn.Module:
    """`root` itself, or, when `pipeline` (a PipelinedModel with `parts`) sits inside it, a
    view of `root` with the pipeline replaced by the merge of its stages."""
    if pipeline is None:
        return root
    path = next((name for name, m in root.named_modules() if m is pipeline), None)
    if path is None:
        raise ValueError(f"the pipeline is not a submodule of {type(root).__name__}")
    merged = merge_modules(list(pipeline.parts))
    return _replace(root, path.split("."), merged) if path else merged


def merge_modules(modules: list[nn.Module]) -> nn.Module:
    """One module whose children are the union of the `modules`' children, merged by name.

    A name held by one module keeps that very submodule (and so its parameters); a name held by
    several (a stage's blocks container) becomes a new container merging theirs. Parameters and
    buffers set directly on a merged module are taken from the first that has them.
    """
    modules = [m for m in modules if m is not None]
    if len(modules) == 1:
        return modules[0]
    view = nn.Module()
    mine = module_internals(view)
    for module in modules:
        theirs = module_internals(module)
        for name, param in theirs.parameters.items():
            if param is not None and name not in mine.parameters:
                view.register_parameter(name, param)
        for name, buffer in theirs.buffers.items():
            if buffer is not None and name not in mine.buffers:
                persistent = name not in theirs.non_persistent_buffers
                view.register_buffer(name, buffer, persistent=persistent)
    names: list[str] = []
    for module in modules:
        children = module_internals(module).modules
        names += [n for n, c in children.items() if c is not None and n not in names]
    for name in names:
        parts = [module_internals(m).modules.get(name) for m in modules]
        view.add_module(name, merge_modules(parts))
    return view


def _replace(root: nn.Module, path: list[str], module: nn.Module) -> nn.Module:
    """A shallow view of `root` with the submodule at `path` replaced by `module`."""
    view = nn.Module()
    internals = module_internals(root)
    for name, param in internals.parameters.items():
        if param is not None:
            view.register_parameter(name, param)
    for name, buffer in internals.buffers.items():
        if buffer is not None:
            persistent = name not in internals.non_persistent_buffers
            view.register_buffer(name, buffer, persistent=persistent)
    for name, child in internals.modules.items():
        if child is None:
            continue
        if name == path[0]:
            child = module if len(path) == 1 else _replace(child, path[1:], module)
        view.add_module(name, child)
    return view


def fused_tensors(module: nn.Module) -> set[str]:
    """The single-device names of the parameters that `module` holds by parts (a fused
    projection split by tensor parallelism, `parallel/fused.py`)."""
    names = set()
    for layer in fused_layers(module):
        for pname, _ in module.get_submodule(layer).named_parameters(recurse=False):
            names.add(WRAPPER_SEGMENTS.sub("", f"{layer}.{pname}"))
    return names


def single_device_state(state: dict[str, dict[str, Any]], fused: set[str]):
    """`state` ({"state_dict": model state, "optimizer_<i>": flat optimizer state}) with each
    tensor of a parameter in `fused` (the parameter and its optimizer state shaped like it,
    under `state.<name>.<key>`) replaced by its single-device view over the same memory: the
    shapes and the order the files hold. New dicts; `state` itself is left as it is."""
    shapes = {
        key: value.shape
        for top, values in state.items()
        if not top.startswith("optimizer_")
        for key, value in values.items()
        if key in fused and isinstance(value, torch.Tensor)
    }
    if not shapes:
        return state
    out = {}
    with torch.no_grad():  # views of the very local tensors, which loads write into
        for top, values in state.items():
            out[top] = {
                key: single_device_view(value) if _by_parts(top, key, value, shapes) else value
                for key, value in values.items()
            }
    return out


def _by_parts(top: str, key: str, value: Any, shapes: dict[str, torch.Size]) -> bool:
    if not isinstance(value, torch.Tensor):
        return False
    name = key
    if top.startswith("optimizer_"):  # flat keys: `state.<parameter name>.<key>`
        if not key.startswith("state."):
            return False
        name = key[len("state.") :].rpartition(".")[0]
    return name in shapes and value.shape == shapes[name]
