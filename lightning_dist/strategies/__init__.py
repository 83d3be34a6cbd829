"""Lightning glue: strategies usable by name in plain Lightning code and from `conf/strategy/`.

Importing this package imports nothing else (the planner must not pay for Lightning); the two
names configs wrote before the strategies had modules of their own resolve on first use. The
names `Trainer(strategy=...)` knows them by are registered by `runtime/strategy_names.py`."""

from __future__ import annotations

import importlib
from typing import Any

_MOVED = {
    "fix_hydra_child_command": "lightning_dist.strategies.launch",
    "single_device_strategy": "lightning_dist.strategies.single",
}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
