"""A strategy added through the contract alone: this module, its schema and
tests/toy_conf/strategy/toy.yaml. Nothing in train.py, preflight.py or the callbacks names it.

`ToyStrategy` is DDP that checkpoints every block's activations and runs only on a power-of-two
number of ranks; both facts reach the rest of the code through the contract."""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from lightning.pytorch.strategies import DDPStrategy

from lightning_dist.config.targets import allow_targets
from lightning_dist.options import StrategyOptions
from lightning_dist.strategies.base import LightningDistStrategy


class ToyStrategy(LightningDistStrategy, DDPStrategy):
    options = StrategyOptions().with_knobs(activation_checkpointing="full")

    def check_run(self, *, devices, num_nodes, **run) -> None:
        world = devices * num_nodes
        if world & (world - 1):
            raise ValueError(f"strategy=toy needs a power-of-two world size, got {world}")
        super().check_run(devices=devices, num_nodes=num_nodes, **run)


@dataclass(kw_only=True)
class ToySchema:
    name: str = "toy"
    _target_: str = "tests.toy_strategy.ToyStrategy"
    process_group_backend: str | None = None


ConfigStore.instance().store(name="schema_toy", node=ToySchema)
allow_targets("strategy", "tests.toy_strategy.")
allow_targets("callbacks", "tests.")  # fault injectors (tests/faults.py) for runs of toy_train.py
