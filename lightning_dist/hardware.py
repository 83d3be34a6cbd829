"""HardwareSpec: the one description of the machines a run uses.

The planner, the MFU callback and the pre-flight device check all read this. The figures in
`conf/hardware/*.yaml` are public datasheet numbers: dense (not sparse) peak FLOP/s, and
bandwidth per device in one direction.

A spec of mixed hardware lists its node groups (`groups`: each a whole spec of one kind of node
with its own `num_nodes`, in the order the run's nodes map to them) and the link between groups
(`site_link_*`); its own per-device figures are then the groups' worst (`memory_gib`, the links,
`matmul_efficiency`) or their mean over the devices (the peaks, so that MFU over all devices is
right), for code that reads one figure; the planner reads each group.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

ACCELERATORS = ("cpu", "gpu")
UNSHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""torchrun's switch giving the workers a store of their own each round (torch's
`dynamic_rendezvous`); elastic jobs need it (HardwareSpec.this_round)."""
ROUND_NODES = "GROUP_WORLD_SIZE"
"""torchrun's node count of the current round, in each worker's environment."""
SHARED_STORE_IN_USE = "TORCHELASTIC_USE_AGENT_STORE"
"""'True' in a worker's environment when torchrun shares its rendezvous store with it."""


@dataclass(kw_only=True)
class HardwareSpec:
    """One kind of node, and how many of them a run uses."""

    name: str = "cpu"
    """Config name, as written to summary.json."""
    accelerator: str = "cpu"
    """'cpu' (gloo, one process per rank) or 'gpu' (CUDA devices)."""
    devices: int = 2
    """Processes (CPU) or GPUs per node; -1 means every GPU on this machine."""
    num_nodes: int = 1
    """Nodes in the run; more than one needs torchrun or SLURM to start the other nodes. In an
    elastic job (`min_nodes` set), the most nodes it runs on."""
    min_nodes: int | None = None
    """Elastic jobs (`torchrun --nnodes=MIN:MAX`): the fewest nodes the job may run on. Each
    torchrun round then takes its node count from torchrun (docs/MULTINODE.md, "Elastic
    jobs"); null: exactly `num_nodes`."""
    memory_gib: float | None = None
    """Memory per device in GiB; None when unknown (CPU ranks share host memory)."""
    peak_tflops_bf16: float | None = None
    """Dense bf16 peak per device in TFLOP/s; None when unknown (MFU is then null)."""
    peak_tflops_fp32: float | None = None
    """Dense fp32 peak per device in TFLOP/s (no TF32); None when unknown."""
    peak_tflops_fp8: float | None = None
    """Dense float8 peak per device in TFLOP/s (fp32 accumulation, as torch._scaled_mm runs);
    None when the device has no float8 matmuls or it is unknown. The planner times float8
    linear layers (`strategy.float8`) with it."""
    memory_gbytes_per_sec: float | None = None
    """Device memory (HBM) bandwidth, GB/s per device, from the datasheet; the planner times the
    memory-bound pointwise ops with it. None when unknown (the planner then counts FLOPs only)."""
    matmul_efficiency: float | None = None
    """Fraction of `peak_tflops_*` that large matmuls sustain in training on this device
    (clocks under its power limit, kernel quality); the planner lowers it for small matmul
    shapes. None: the planner's CPU default (planner/settings.py DEFAULT_EFFICIENCY).
    On a GPU of known datasheet power (planner/compute.py DATASHEET_POWER_W) it is the fraction
    at that power; `power_w` below it lowers the sustained clock."""
    power_w: float | None = None
    """The power limit each device runs at, watts (`nvidia-smi -pl`): the datasheet TDP unless
    the site caps it. Below the datasheet TDP the sustained clock drops, and with it every
    compute rate the planner uses (planner/compute.py `sustained_clock_share`). None: unknown
    (no power scaling)."""
    intra_node_gbytes_per_sec: float | None = None
    """Device-to-device bandwidth inside a node, GB/s per device and direction (NVLink, PCIe)."""
    inter_node_gbytes_per_sec: float | None = None
    """Network bandwidth between nodes, GB/s per device and direction (InfiniBand, Ethernet)."""
    precision: str = "32-true"
    """Default Lightning precision on this hardware."""
    backend: str = "gloo"
    """torch.distributed backend: 'gloo' on CPUs, 'nccl' on NVIDIA GPUs."""
    cpus_per_node: int | None = None
    """Logical CPUs of one node (hardware threads); a Slurm job gives each rank its share.
    None when unknown."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment a cluster job exports on these nodes (NCCL and network settings); written
    into the Slurm script by `python -m lightning_dist.launch slurm`."""
    groups: dict[str, HardwareSpec] = field(default_factory=dict)
    """Mixed hardware: the node groups by name, each a spec of one kind of node with its own
    `num_nodes`, in the order the run's nodes map to them (the first group's nodes first). A
    group is written as a defaults entry of the mixed spec, `- dgx_h100@groups.h100`, and
    changed as `hardware.groups.h100.num_nodes=4`. Empty: one kind of node."""
    site_link_gbytes_per_sec: float | None = None
    """Mixed hardware: bandwidth between node groups, GB/s per device and direction (a link
    between sites or clusters); null: the groups' slowest `inter_node_gbytes_per_sec`."""
    site_link_latency_ms: float | None = None
    """Mixed hardware: one-way latency between node groups, in milliseconds; null: the
    network's inside a site (RING_STEP_LATENCY_S in planner/settings.py)."""

    def __post_init__(self) -> None:
        self.groups = {
            k: v if isinstance(v, HardwareSpec) else HardwareSpec(**v)
            for k, v in self.groups.items()
        }
        if self.groups:
            self._check_groups()
        if self.accelerator not in ACCELERATORS:
            raise ValueError(
                f"hardware.accelerator={self.accelerator!r} is not one of {', '.join(ACCELERATORS)}"
            )
        if self.devices == 0 or self.devices < -1:
            raise ValueError(
                f"hardware.devices={self.devices} must be positive (or -1 for all GPUs)"
            )
        if self.matmul_efficiency is not None and not 0 < self.matmul_efficiency <= 1:
            raise ValueError(
                f"hardware.matmul_efficiency={self.matmul_efficiency} must be in (0, 1]: the "
                "fraction of the peak that large matmuls sustain"
            )
        if self.power_w is not None and self.power_w <= 0:
            raise ValueError(
                f"hardware.power_w={self.power_w} must be positive (or null when unknown)"
            )
        if self.memory_gbytes_per_sec is not None and self.memory_gbytes_per_sec <= 0:
            raise ValueError(
                f"hardware.memory_gbytes_per_sec={self.memory_gbytes_per_sec} must be positive "
                "(or null when unknown)"
            )
        if self.num_nodes < 1:
            raise ValueError(f"hardware.num_nodes={self.num_nodes} must be at least 1")
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.num_nodes:
            raise ValueError(
                f"hardware.min_nodes={self.min_nodes} must be between 1 and hardware.num_nodes="
                f"{self.num_nodes} (the most nodes), as in torchrun --nnodes=MIN:MAX"
            )

    def _check_groups(self) -> None:
        """Mixed hardware: one line naming the value when the groups cannot form one run."""
        groups = self.groups
        kinds = {g.accelerator for g in groups.values()}
        devices = {g.devices for g in groups.values()}
        counts = ", ".join(f"{k} {g.num_nodes}" for k, g in groups.items())
        if len(kinds) > 1 or len(devices) > 1:
            raise ValueError(
                f"hardware={self.name}: the node groups must have one accelerator and one "
                f"device count per node (got {sorted(kinds)} and {sorted(devices)} devices); "
                "mixed device counts per node are not supported"
            )
        nested = [k for k, g in groups.items() if g.groups]
        if nested:
            raise ValueError(
                f"hardware.groups.{nested[0]} has groups of its own; list every "
                "node group at the top"
            )
        total = sum(g.num_nodes for g in groups.values())
        if self.num_nodes != total:
            raise ValueError(
                f"hardware.num_nodes={self.num_nodes} but the node groups hold {total} nodes "
                f"({counts}); change a group's count (hardware.groups.<name>.num_nodes) and "
                f"set hardware.num_nodes={total}, their sum"
            )
        if self.min_nodes is not None:
            raise ValueError(
                f"hardware.min_nodes={self.min_nodes}: elastic jobs of mixed "
                "hardware are not supported; set hardware.min_nodes=null"
            )
        # One figure for code that reads one: the worst group's, or the mean over the devices
        # for the peaks (MFU divides by the sum of every device's peak).
        specs = list(groups.values())
        first = specs[0]
        self.accelerator, self.devices = first.accelerator, first.devices
        self.precision, self.backend = first.precision, first.backend

        def worst(name: str):
            values = [getattr(g, name) for g in specs]
            return None if None in values else min(values)

        def mean(name: str):
            values = [getattr(g, name) for g in specs]
            if None in values:
                return None
            return sum(v * g.num_nodes for v, g in zip(values, specs, strict=True)) / total

        for name in (
            "memory_gib",
            "memory_gbytes_per_sec",
            "matmul_efficiency",
            "power_w",
            "intra_node_gbytes_per_sec",
            "inter_node_gbytes_per_sec",
            "cpus_per_node",
        ):
            setattr(self, name, worst(name))
        for name in ("peak_tflops_bf16", "peak_tflops_fp32", "peak_tflops_fp8"):
            setattr(self, name, mean(name))

    @property
    def mixed(self) -> bool:
        """Does the run mix node groups (`groups`)?"""
        return bool(self.groups)

    def node_group(self, node: int) -> tuple[str, HardwareSpec]:
        """The (name, spec) of the group node `node` (0-based, in rank order) belongs to; the
        spec itself for one kind of node."""
        if not self.groups:
            return self.name, self
        first = 0
        for name, group in self.groups.items():
            if node < first + group.num_nodes:
                return name, group
            first += group.num_nodes
        raise ValueError(f"node {node} is outside the {self.num_nodes} nodes of {self.name}")

    @property
    def world_size(self) -> int:
        """Total ranks, once `devices` is known (-1 resolves against this machine)."""
        return self.resolved_devices() * self.num_nodes

    def node_counts(self) -> range:
        """Every node count the run may have: `num_nodes`, or min_nodes..num_nodes if elastic."""
        return range(self.min_nodes or self.num_nodes, self.num_nodes + 1)

    def this_round(self, environ: Mapping[str, str] = os.environ) -> HardwareSpec:
        """This spec with the node count of the current torchrun round (`ROUND_NODES`)
        when the job is elastic; itself otherwise, and outside torchrun (plans are made for
        `num_nodes`, the most). ValueError for a round outside min_nodes..num_nodes, or one
        started on torchrun's shared store, on which a joining node deadlocks the agents."""
        if self.min_nodes is None or ROUND_NODES not in environ:
            return self
        nodes = int(environ[ROUND_NODES])
        allowed = f"hardware.min_nodes={self.min_nodes} to hardware.num_nodes={self.num_nodes}"
        if nodes not in self.node_counts():
            raise ValueError(
                f"torchrun started this round on {nodes} node(s), outside {allowed}; start "
                f"torchrun with --nnodes={self.min_nodes}:{self.num_nodes}"
            )
        if environ.get(SHARED_STORE_IN_USE) == "True":
            raise ValueError(
                "an elastic job (hardware.min_nodes is set) is running on torchrun's shared "
                "rendezvous store, on which a node joining deadlocks the agents; start it with "
                "`python -m lightning_dist.launch torchrun ...` (or set "
                f"{UNSHARED_STORE}=1 for torchrun)"
            )
        return replace(self, num_nodes=nodes)

    def resolved_devices(self) -> int:
        if self.devices != -1:
            return self.devices
        import torch

        return max(torch.cuda.device_count(), 1)

    def peak_flops(self, precision: str) -> float | None:
        """Peak FLOP/s per device for a Lightning precision string, or None if unknown."""
        tflops = self.peak_tflops_fp32 if precision.startswith("32") else self.peak_tflops_bf16
        return None if tflops is None else tflops * 1e12

    def check_machine(self) -> None:
        """Raise ValueError with one clear line if this machine cannot run this spec."""
        if self.accelerator == "gpu":
            import torch

            have = torch.cuda.device_count()
            need = self.devices if self.devices != -1 else 1
            if have < need:
                raise ValueError(
                    f"hardware={self.name} needs {need} CUDA device{'s' if need > 1 else ''} per "
                    f"node; this machine has {have}. Add plan.only=true to predict its memory "
                    "and speed here, or train here with hardware=cpu."
                )
