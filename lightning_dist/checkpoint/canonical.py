"""The single-device names of a parallelised model, whatever its layout.

DCP's `get_model_state_dict` already drops the names that FSDP, activation checkpointing and
torch.compile insert. What it cannot see through is a pipeline: a rank holds its stages as
`parts.<k>` of a `PipelinedModel`, each a copy of the model with the other stages' modules
removed. `canonical_module` builds a view (new container modules, the same parameters) in which
each rank's stages sit where they sit in the whole model, so `layers.5.attention.wq.weight` has
that name on every layout and DCP can move it between stage counts and schedules.
"""

from __future__ import annotations

from torch import nn


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
    for module in modules:
        for name, param in module._parameters.items():
            if param is not None and name not in view._parameters:
                view.register_parameter(name, param)
        for name, buffer in module._buffers.items():
            if buffer is not None and name not in view._buffers:
                persistent = name not in module._non_persistent_buffers_set
                view.register_buffer(name, buffer, persistent=persistent)
    names: list[str] = []
    for module in modules:
        names += [n for n, c in module._modules.items() if c is not None and n not in names]
    for name in names:
        view.add_module(name, merge_modules([m._modules.get(name) for m in modules]))
    return view


def _replace(root: nn.Module, path: list[str], module: nn.Module) -> nn.Module:
    """A shallow view of `root` with the submodule at `path` replaced by `module`."""
    view = nn.Module()
    for name, param in root._parameters.items():
        if param is not None:
            view.register_parameter(name, param)
    for name, buffer in root._buffers.items():
        if buffer is not None:
            persistent = name not in root._non_persistent_buffers_set
            view.register_buffer(name, buffer, persistent=persistent)
    for name, child in root._modules.items():
        if child is None:
            continue
        if name == path[0]:
            child = module if len(path) == 1 else _replace(child, path[1:], module)
        view.add_module(name, child)
    return view
