"""The configuration floor: typed Hydra schemas (`schemas.py`), the allow-list of `_target_`s
(`targets.py`), the OmegaConf resolvers the Slurm launcher's YAML uses (`resolvers.py`).
Torch- and Lightning-free: the planner CLI and `train.py`'s first checks compose configs."""

from lightning_dist.config.schemas import (
    CONF_DIR,
    CONF_MODULE,
    TrainSchema,
    choice_names,
    compose_config,
    hardware_spec,
    model_spec,
    register_schemas,
)

__all__ = [
    "CONF_DIR",
    "CONF_MODULE",
    "TrainSchema",
    "choice_names",
    "compose_config",
    "hardware_spec",
    "model_spec",
    "register_schemas",
]
