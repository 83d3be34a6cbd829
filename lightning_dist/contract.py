"""The strategy contract: what every lightning_dist strategy tells the rest of the code.

`train()`, the pre-flight check, the planner and the telemetry learn about a strategy only
through `StrategyContract`, never by probing attribute names. A new strategy implements it (the
`LightningDistStrategy` mixin in `strategies/base.py` gives the defaults) in its own module, stores
its schema in Hydra's ConfigStore (ours are generated in `config/schemas.py`; docs/STRATEGIES.md)
and adds a YAML file to `lightning_dist/conf/strategy/`, and gets pre-flight checks,
planner settings and telemetry with no edit elsewhere.

This module imports neither Lightning nor torch.distributed: the planner reads it on a laptop.
A strategy that does not implement the contract (Lightning's own DDPStrategy, a user's custom
one) is read through `contract_of`, which treats it as plain data parallelism.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from lightning_dist.layout import Layout
from lightning_dist.options import StrategyOptions


@runtime_checkable
class StrategyContract(Protocol):
    """What a lightning_dist strategy declares. Every method is free of side effects."""

    single_process: bool
    """True for a strategy that runs one process whatever `hardware.devices` says."""
    pipelined: bool
    """True once the model is split into pipeline stages (each runs once per microbatch)."""
    options: StrategyOptions
    """Every knob as configured (lightning_dist/options/): the planner's input."""
    placement: Any
    """Once the processes exist: the node of every rank and the rank groups of each parallel
    dimension (`lightning_dist.cluster.nodes.Placement`); None before, or when unknown."""

    def layout_for(self, devices: int, num_nodes: int) -> Layout:
        """The layout this strategy runs on `num_nodes` nodes of `devices` ranks (resolved)."""
        ...

    def check_environment(self) -> None:
        """Raise ValueError when this process was not started as the strategy needs (a
        training run's check, before any process group; the planner skips it)."""
        ...

    def heals_from_peer(self) -> bool:
        """True in a process relaunched into a running job that takes its state from a peer
        (`ft_hsdp`): it does not resume from its own checkpoint."""
        ...

    def mean_over_replica_groups(self, value: Any) -> Any:
        """A rank's step loss averaged over the replica groups that trained the step
        (`ft_hsdp`); `value` itself for every other strategy."""
        ...

    def summary_fields(self) -> dict[str, Any]:
        """Keys this strategy adds to summary.json (`ft_hsdp`: the groups of every step)."""
        ...

    def data_shares(self, layout: Layout) -> int:
        """How many data-parallel shares the global batch is cut into on `layout`: its dp,
        times the replica groups for `strategy=ft_hsdp`."""
        ...

    def dp_weights(self) -> list[int] | None:
        """The relative share of the global batch of each data-parallel rank, in rank order
        (`strategy.dp_shares`: faster ranks take more micro-batches); None: equal shares."""
        ...

    def loss_weight(self) -> float:
        """The factor on this rank's mean micro-batch loss of a step (in backward and in the
        logged mean over ranks) that gives every micro-batch of the global batch one weight:
        dp x share / sum of shares under `dp_weights`, 1 otherwise."""
        ...

    def check_run(
        self,
        *,
        devices: int,
        num_nodes: int,
        precision: str,
        accelerator: str,
        model: Any = None,
        global_batch_size: int | None = None,
        micro_batch_size: int | None = None,
    ) -> None:
        """Raise ValueError naming the bad value if this run cannot work; change nothing.

        `model` is the model built on the meta device; the batch sizes are `data.*`.
        """
        ...

    def parallelize_model(self, model: Any, *, init_seed: int) -> Any:
        """Apply the layout to a meta-device model and return this rank's materialised part."""
        ...

    def enable_async_save(self) -> None:
        """Write checkpoints in the background; ValueError if this strategy cannot."""
        ...


class ContractDefaults:
    """The contract's members that most strategies answer alike: one replica group, started by
    any launcher, the batch cut into the layout's dp shares. `ft_hsdp` overrides them."""

    def check_environment(self) -> None:
        """Nothing to check."""

    def heals_from_peer(self) -> bool:
        """False: a restarted process resumes from its checkpoint."""
        return False

    def mean_over_replica_groups(self, value: Any) -> Any:
        """One replica group: the value as is."""
        return value

    def summary_fields(self) -> dict[str, Any]:
        """Nothing more for summary.json."""
        return {}

    def data_shares(self, layout: Layout) -> int:
        """The layout's dp."""
        return layout.dp

    def dp_weights(self) -> list[int] | None:
        """Equal shares."""
        return None

    def loss_weight(self) -> float:
        """Equal shares: every rank's mean counts alike."""
        return 1.0


class _PlainDataParallel(ContractDefaults):
    """`contract_of` for a strategy that does not declare the contract: every rank is a
    data-parallel replica (DDP), or one process for a single-device strategy."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy
        self.single_process = type(strategy).__name__ == "SingleDeviceStrategy"
        self.pipelined = False
        self.placement = None
        self.options = StrategyOptions()

    def layout_for(self, devices: int, num_nodes: int) -> Layout:
        return Layout() if self.single_process else Layout(dp_replicate=devices * num_nodes)

    def check_run(self, **run: Any) -> None:
        pass

    def enable_async_save(self) -> None:
        raise ValueError(
            f"trainer.checkpoint.async_save=true is not supported by {type(self.strategy).__name__}"
        )

    def parallelize_model(self, model: Any, *, init_seed: int) -> Any:
        from lightning_dist.models.materialize import materialize

        return materialize(model, self.strategy.root_device, init_seed)


def contract_of(strategy: Any) -> StrategyContract:
    """The strategy itself if it declares the contract, else a plain data-parallel reading."""
    if isinstance(strategy, StrategyContract):
        return strategy
    return _PlainDataParallel(strategy)


def running_layout(strategy: Any) -> Layout:
    """The layout of a strategy whose processes exist (Lightning knows its node count)."""
    return contract_of(strategy).layout_for(strategy.num_processes, strategy.num_nodes)
