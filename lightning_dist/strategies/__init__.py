"""Lightning glue: strategies usable by name in plain Lightning code and from `conf/strategy/`."""

from lightning_dist.strategies.launch import fix_hydra_child_command
from lightning_dist.strategies.single import single_device_strategy

__all__ = ["fix_hydra_child_command", "single_device_strategy"]
