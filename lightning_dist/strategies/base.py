"""`LightningDistStrategy`: the defaults of the strategy contract (lightning_dist/contract.py).

Mixed into each of our Lightning strategies before Lightning's own class. A strategy declares
its layout with `declared_layout(num_nodes)` (one degree may be -1, "the remaining ranks"), and
overrides `check_run` and `parallelize_model` where it has more to say; its knobs are
`self.options` (lightning_dist/options/), built in its constructor by `build_options`.
Every strategy saves and loads the one checkpoint format (`FormatCheckpointHooks`).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from torch import nn

from lightning_dist._compat import process_group_settings
from lightning_dist.cluster.elastic import init_process_group_for_attempt
from lightning_dist.cluster.nodes import (
    Placement,
    check_node_counts,
    gather_node_map,
    local_node_map,
    mesh_groups,
)
from lightning_dist.cluster.simulate import apply_simulated_speed
from lightning_dist.contract import ContractDefaults
from lightning_dist.layout import MESH_DIMS, Layout
from lightning_dist.models.materialize import materialize
from lightning_dist.options import KNOB_GROUP, PRESETS, StrategyOptions, group_knobs, knob_reference
from lightning_dist.options.optimizer_sharding import check_shard_optimizer_precision
from lightning_dist.parallel.compile import apply_compile, check_compile
from lightning_dist.parallel.float8 import apply_float8, check_float8
from lightning_dist.parallel.fsdp import find_block_types
from lightning_dist.runtime.refusal import install_refusal_hook, refusals
from lightning_dist.strategies.checkpoint_hooks import FormatCheckpointHooks


def knob_signature(cls: type) -> inspect.Signature:
    """`cls.__init__`'s signature with its `**knobs` spelt out as keyword-only parameters (the
    preset's defaults); a `**kwargs` that goes on to Lightning stays at the end."""
    own = list(inspect.signature(cls.__init__).parameters.values())[1:]
    spec = PRESETS[cls.preset]
    knobs = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=spec.default(f))
        for g in spec.groups
        for f in group_knobs(g)
    ]
    rest = [p for p in own if p.kind is not inspect.Parameter.VAR_KEYWORD]
    tail = [p for p in own if p.kind is inspect.Parameter.VAR_KEYWORD and p.name != "knobs"]
    return inspect.Signature([*knobs, *rest, *tail])


def build_options(
    owner: type, preset: str, options: StrategyOptions | None, kwargs: dict[str, Any]
) -> tuple[StrategyOptions, dict[str, Any]]:
    """Split a strategy's keyword arguments into its knobs, built into `StrategyOptions` by
    its preset, and the rest (Lightning's own: accelerator, parallel_devices, ...)."""
    install_refusal_hook()  # a user's own script reports our refusals in one line too
    knobs = {k: kwargs.pop(k) for k in list(kwargs) if k in KNOB_GROUP}
    if options is not None and knobs:
        raise TypeError(f"{owner.__name__}: pass options= or knobs ({', '.join(knobs)}), not both")
    with refusals():
        return options or PRESETS[preset].build(knobs, owner.__name__), kwargs


class LightningDistStrategy(ContractDefaults, FormatCheckpointHooks):
    """The contract's defaults; `self` is also a Lightning strategy (root_device, num_nodes)."""

    preset: str | None = None
    """The entry of `lightning_dist.options.PRESETS` that gives the class its knobs."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The class's own docstring and signature list its knobs, read from the option classes,
        # so help() and editors show every keyword argument without a hand-kept copy.
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("preset") is None:
            return
        cls.__doc__ = (cls.__doc__ or "") + "\n" + knob_reference(cls.preset)
        cls.__signature__ = knob_signature(cls)

    single_process = False
    pipelined = False
    options: StrategyOptions = StrategyOptions()
    """Every knob of this strategy (lightning_dist/options/), built once in `__init__`; the
    planner, `parallelize()` and the checks read it."""
    placement: Placement | None = None
    """The node of every rank and the groups of each dimension, once the processes exist."""

    def declared_layout(self, num_nodes: int) -> Layout:
        """The degrees as configured; one may be -1. Pure data parallelism by default."""
        return Layout(dp_replicate=-1)

    def layout_for(self, devices: int, num_nodes: int) -> Layout:
        """The layout on `num_nodes` nodes of `devices` ranks; ValueError if it cannot exist."""
        layout = self.declared_layout(num_nodes).resolve(devices * num_nodes)
        layout.check_nodes(devices, num_nodes)
        return layout

    @property
    def layout(self) -> Layout:
        """The running layout once the processes exist, the declared one before."""
        if getattr(self, "parallel_devices", None):
            return self.layout_for(len(self.parallel_devices), self.num_nodes)
        return self.declared_layout(self.num_nodes)

    def check_run(
        self,
        *,
        devices: int,
        num_nodes: int,
        precision: str,
        accelerator: str,
        model: nn.Module | None = None,
        global_batch_size: int | None = None,
        micro_batch_size: int | None = None,
    ) -> None:
        """Raise ValueError if the layout cannot exist on this run; changes nothing."""
        layout = self.layout_for(devices, num_nodes)
        check_shard_optimizer_precision(self.options, precision)
        if global_batch_size is not None:
            layout.check_batch(global_batch_size, micro_batch_size)
        self.check_simulation(accelerator, devices * num_nodes)

    delays_gradients = False
    """Whether `strategy.simulate_delay_ms` has a gradient all-reduce to delay (DDP's hook)."""

    def check_simulation(self, accelerator: str, world_size: int) -> None:
        """The simulation test tool (`strategy.simulate_*`) runs here: on CPUs, with ranks that
        exist, and a delay only where the strategy has a hook for it; ValueError otherwise."""
        sim = self.options.simulate
        if not sim.enabled:
            return
        if accelerator != "cpu":
            raise ValueError(
                f"strategy.simulate_slowdown / simulate_delay_ms are a CPU test tool (a host-side "
                f"sleep does not slow {accelerator} kernels); unset them, or use hardware=cpu"
            )
        beyond = sorted(r for r in (sim.simulate_slowdown or {}) if r >= world_size)
        if beyond:
            raise ValueError(
                f"strategy.simulate_slowdown names rank(s) {beyond}, but the run has {world_size} "
                f"ranks (0 to {world_size - 1})"
            )
        if sim.simulate_delay_ms > 0 and not self.delays_gradients:
            raise ValueError(
                f"strategy.simulate_delay_ms={sim.simulate_delay_ms:g} delays DDP's gradient "
                f"all-reduce; {type(self).__name__} has no hook for it: use strategy=ddp or set "
                "strategy.simulate_delay_ms=0"
            )

    def simulate_speed(self, parts: list[nn.Module]) -> None:
        """Pace each model part at this rank's simulated speed (`strategy.simulate_slowdown`,
        a test tool: cluster/simulate.py); nothing when it is off."""
        sim = self.options.simulate
        factor = sim.factor(self.global_rank)
        if factor is None:
            return
        for part in parts:
            blocks = find_block_types(part, self.options.sharding.auto_wrap)
            apply_simulated_speed(part, blocks, factor=factor, flops=sim.simulate_flops)

    @property
    def compile_backend(self) -> str | None:
        """The backend `parallelize_model` compiles each block with; None: no compilation."""
        return self.options.compile.backend

    def enable_async_save(self) -> None:
        """Write checkpoints in the background; only the FSDP2/3D core can (sharded saves)."""
        raise ValueError(
            f"trainer.checkpoint.async_save=true is not supported by {type(self).__name__}; use "
            "strategy=fsdp2 or a 3d layout (sharded checkpoints), or set it to false"
        )

    def setup_environment(self) -> None:
        self.join_process_group()
        super().setup_environment()
        install_refusal_hook()  # outside torch.distributed's, which init_process_group installs
        self.place_on_nodes()

    def join_process_group(self) -> None:
        """Under torchrun restarts, join the process group in this attempt's own key space
        before Lightning would (cluster/elastic.py says why); elsewhere nothing."""
        if self.single_process:
            return
        init_process_group_for_attempt(*process_group_settings(self))

    def place_on_nodes(self, mesh=None) -> None:
        """Learn the node of every rank (one all-gather) and check it against the configured
        node count and the layout: NodePlacementError, the same on every rank, before any
        model exists. Groups come from `mesh` (a DeviceMesh) if given, else from the layout."""
        if self.single_process:
            self.placement = Placement(nodes=local_node_map(), groups={})
            return
        nodes = gather_node_map(self.root_device)
        check_node_counts(nodes, num_nodes=self.num_nodes, devices=self.num_processes)
        layout = self.layout
        if mesh is not None:
            groups = mesh_groups(mesh, MESH_DIMS)
        else:
            groups = {d: layout.group_ranks(d) for d in MESH_DIMS if getattr(layout, d) > 1}
        self.placement = Placement(nodes=nodes, groups=groups)
        hsdp = layout.dp_replicate > 1 and layout.dp_shard > 1
        for line in self.placement.check(hsdp=hsdp):
            if self.global_rank == 0:
                print(f"warning: {line}", file=sys.stderr, flush=True)

    def parallelize_model(self, model: nn.Module, *, init_seed: int) -> Any:
        """Materialise the whole model on this rank (data-parallel strategies shard later),
        convert its linear layers to float8 when `strategy.float8` is set, and compile each
        block when `compile_backend` is set."""
        model = materialize(model, self.root_device, init_seed)
        model = apply_float8(model, self.options.float8.float8, device_type=self.root_device.type)
        if self.compile_backend is not None:
            apply_compile(model, find_block_types(model), backend=self.compile_backend)
        self.simulate_speed([model])
        return model

    def check_machine_options(self) -> None:
        """The compile and float8 settings can run on this machine (inductor needs a C
        compiler; float8 needs torchao, and float8 matmuls on a GPU)."""
        check_compile(self.options.compile.compile, self.options.compile.compile_backend)
        check_float8(self.options.float8.float8)
