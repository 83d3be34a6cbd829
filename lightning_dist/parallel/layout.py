"""Layout: the one description of how ranks are split into data, tensor and pipeline groups.

The strategies, the planner and the telemetry all read it. It validates itself on construction
and names the offending numbers; building the DeviceMesh is the only part that needs
torch.distributed, and it is imported lazily so the planner can use this file on a laptop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# Mesh dimensions from outermost (slowest links, across nodes) to innermost (NVLink).
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")
SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Parallel degrees and pipeline settings. `-1` on one degree means "the remaining ranks"."""

    pp: int = 1
    """Pipeline stages (one per rank along this dimension)."""
    dp_replicate: int = 1
    """Data-parallel replicas (DDP, or the replicate dimension of HSDP)."""
    dp_shard: int = 1
    """Data-parallel ranks that shard parameters (FSDP)."""
    tp: int = 1
    """Tensor-parallel ranks, which split each layer (keep within one node)."""
    schedule: str = "1F1B"
    """Pipeline schedule; only read when pp > 1."""
    microbatches: int | None = None
    """Microbatches per step under PP; None means 2 x pp."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank (interleaved schedules use more than one)."""

    def __post_init__(self) -> None:
        degrees = self.degrees()
        bad = {k: v for k, v in degrees.items() if v == 0 or v < -1}
        if bad:
            raise ValueError(f"parallel degrees must be positive or -1, got {_fmt(bad)}")
        if sum(v == -1 for v in degrees.values()) > 1:
            raise ValueError(f"at most one degree may be -1, got {_fmt(degrees)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"schedule={self.schedule!r} is not one of {', '.join(SCHEDULES)}"
            )
        if self.virtual_stages < 1:
            raise ValueError(f"virtual_stages={self.virtual_stages} must be at least 1")
        if self.microbatches is not None and self.microbatches < 1:
            raise ValueError(f"microbatches={self.microbatches} must be at least 1")
        if self.pp > 1 and self.schedule == "1F1B" and self.num_microbatches < self.pp:
            raise ValueError(
                f"schedule=1F1B needs at least pp={self.pp} microbatches, got {self.num_microbatches}"
            )

    def degrees(self) -> dict[str, int]:
        """The degrees in mesh order (outermost first)."""
        return {name: getattr(self, name) for name in MESH_DIMS}

    @property
    def dp(self) -> int:
        """Data-parallel size: the number of different batches processed at once."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return math.prod(self.degrees().values())

    @property
    def num_microbatches(self) -> int:
        return self.microbatches if self.microbatches is not None else 2 * self.pp

    def resolve(self, world_size: int) -> Layout:
        """Fill a `-1` degree from `world_size` and check that the degrees multiply to it."""
        degrees = self.degrees()
        known = math.prod(v for v in degrees.values() if v != -1)
        free = [k for k, v in degrees.items() if v == -1]
        if free:
            if world_size % known:
                raise ValueError(
                    f"world size {world_size} is not divisible by {_fmt(degrees)} (product {known})"
                )
            degrees[free[0]] = world_size // known
        product = math.prod(degrees.values())
        if product != world_size:
            raise ValueError(
                f"parallel degrees {_fmt(degrees)} multiply to {product}, "
                f"but the world size is {world_size}"
            )
        return replace(self, **degrees)

    def build_mesh(self, device_type: str):
        """Build the named DeviceMesh; dimensions of size 1 are kept so names always resolve."""
        from torch.distributed.device_mesh import init_device_mesh

        if -1 in self.degrees().values():
            raise ValueError("resolve(world_size) the layout before building its mesh")
        return init_device_mesh(
            device_type, tuple(self.degrees().values()), mesh_dim_names=MESH_DIMS
        )


def _fmt(degrees: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in degrees.items())
