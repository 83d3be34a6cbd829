"""HardwareSpec: the one description of the machines a run uses.

The planner, the MFU callback and the pre-flight device check all read this. The figures in
`conf/hardware/*.yaml` are public datasheet numbers: dense (not sparse) peak FLOP/s, and
bandwidth per device in one direction.
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
    shapes. None: the planner's CPU default (planner/settings.py DEFAULT_EFFICIENCY)."""
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

    def __post_init__(self) -> None:
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
