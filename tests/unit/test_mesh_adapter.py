"""The mesh adapter (lightning_dist/strategies/mesh.py) stands on Lightning's public
`ParallelStrategy`: every Lightning hook it overrides is marked `@override` and typed, and the
mesh presets are that one class."""

import inspect

from lightning.pytorch.strategies import ModelParallelStrategy, ParallelStrategy

from lightning_dist.strategies.fsdp2 import FSDP2Strategy
from lightning_dist.strategies.ft_hsdp import FTHSDPStrategy
from lightning_dist.strategies.mesh import MeshStrategy
from lightning_dist.strategies.parallel3d import Parallel3DStrategy


def _function(member):
    return member.fget if isinstance(member, property) else getattr(member, "__func__", member)


def _hooks_we_define() -> dict[str, object]:
    """{name: the member MeshStrategy resolves it to} for every Lightning strategy hook whose
    resolution is a class of ours (the adapter, or a mixin of ours before Lightning's class)."""
    found = {}
    for name in dir(ParallelStrategy):
        if name.startswith("__"):
            continue
        owner = next(c for c in MeshStrategy.__mro__ if name in vars(c))
        member = vars(owner)[name]
        if owner.__module__.startswith("lightning_dist") and callable(_function(member)):
            found[name] = member
    return found


def test_every_lightning_hook_the_adapter_overrides_is_marked_and_typed():
    hooks = _hooks_we_define()
    assert len(hooks) >= 20, sorted(hooks)  # the checks below must have something to hold
    unmarked = [n for n, m in hooks.items() if not getattr(_function(m), "__override__", False)]
    untyped = [n for n, m in hooks.items() if "return" not in inspect.get_annotations(_function(m))]
    assert not unmarked, f"Lightning hooks overridden without @override: {sorted(unmarked)}"
    assert not untyped, f"Lightning hooks without a return type: {sorted(untyped)}"


def test_the_mesh_presets_are_one_adapter_on_the_public_parallel_strategy():
    for preset in (Parallel3DStrategy, FSDP2Strategy, FTHSDPStrategy):
        assert issubclass(preset, MeshStrategy), preset
        assert not issubclass(preset, ModelParallelStrategy), preset
    assert ParallelStrategy in MeshStrategy.__mro__
