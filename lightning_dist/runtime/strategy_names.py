"""Registry names for plain Lightning code: `Trainer(strategy="fsdp_tuned")` after
`import lightning_dist`.

Importing Lightning takes seconds and the planner imports this package on laptops, so the names
are registered when `lightning.pytorch` finishes loading (at once if it already has), not by
importing Lightning here.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

STRATEGIES = {
    "fsdp_tuned": "lightning_dist.strategies.fsdp:TunedFSDPStrategy",
    "fsdp2": "lightning_dist.strategies.fsdp2:FSDP2Strategy",
    "3d": "lightning_dist.strategies.parallel3d:Parallel3DStrategy",
    "ft_hsdp": "lightning_dist.strategies.ft_hsdp:FTHSDPStrategy",
}
"""Registry name -> "module:class"; each class registers itself in `register_strategies`. Each is
the strategy's one name (`strategy=<name>`, `/schema_<name>`, `options.PRESETS[<name>]`), but
FSDP1's: Lightning's registry already holds `fsdp` (its own FSDPStrategy), so ours is
`fsdp_tuned` there."""

RENAMED = {
    "parallel3d": "3d",
    "schema_parallel3d": "schema_3d",
}
"""Old names that still work, old -> new: in `Trainer(strategy=...)`, a YAML's defaults list
(`/schema_parallel3d`), a checkpoint's manifest. Each use prints `deprecation_line(old)`."""


def deprecation_line(old: str) -> str:
    """The one line printed where an old name is used."""
    return (
        f"deprecated: the strategy name {old!r} is now {RENAMED[old]!r}; the old one still "
        "works (runtime/strategy_names.RENAMED) but will go"
    )


def current_name(name: str) -> str:
    """The name an old strategy name now has (itself when it is current)."""
    return RENAMED.get(name, name)


_TRIGGER = "lightning.pytorch"


def register_strategies() -> None:
    """Add our names to Lightning's StrategyRegistry (idempotent). While one of our strategy
    modules is still being imported (its own first `import lightning` brought us here), it
    waits: each of them calls this again on its last line, once its class exists."""
    from lightning.pytorch.strategies import StrategyRegistry

    targets = {name: target.split(":") for name, target in STRATEGIES.items()}
    if any(m in sys.modules and not hasattr(sys.modules[m], c) for m, c in targets.values()):
        return
    for name, (module, cls) in targets.items():
        strategy = getattr(importlib.import_module(module), cls)
        if name not in StrategyRegistry:  # importing it may have registered it already
            strategy.register_strategies(StrategyRegistry)


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds `lightning.pytorch` through the other finders and registers once it has run."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TRIGGER:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            run_module = spec.loader.exec_module

            def exec_module(module):
                run_module(module)
                register_strategies()

            spec.loader.exec_module = exec_module
        return spec


def register_when_lightning_loads() -> None:
    """Register now if Lightning is loaded, else as soon as it is."""
    if _TRIGGER in sys.modules:
        register_strategies()
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
