"""The process group of the mesh adapter (strategies/mesh.py), on torch.distributed's public
calls: its device, joining the group (in a torchrun restart's own key space first), the ranks
Lightning's helpers print from, and the collectives Lightning asks a strategy for."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from typing_extensions import override

from lightning_dist.cluster.elastic import init_process_group_for_attempt
from lightning_dist.parallel.tp import plain_tensor

if TYPE_CHECKING:  # the class it is mixed into, for the type checker; no base at run time
    from lightning.pytorch.strategies import ParallelStrategy as MixedInto
else:
    MixedInto = object


class TorchProcessGroup(MixedInto):
    """Mixed into a Lightning `ParallelStrategy` before Lightning's class."""

    process_group_backend: str | None = None
    """The backend asked for; None: the device's (NCCL on CUDA, else gloo)."""
    timeout: timedelta | None = default_pg_timeout
    """The process group's collective timeout."""

    @property
    @override
    def root_device(self) -> torch.device:
        assert self.parallel_devices is not None
        return self.parallel_devices[self.local_rank]

    @property
    def num_processes(self) -> int:
        """The processes of this node."""
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    def backend(self) -> str:
        """The process group's backend: the configured one, else the device's."""
        return self.process_group_backend or ("nccl" if self.root_device.type == "cuda" else "gloo")

    def join_process_group(self) -> None:
        """Under torchrun restarts, join this attempt's key space first (cluster/elastic.py)."""
        init_process_group_for_attempt(self.backend(), self.timeout or default_pg_timeout)

    def set_world_ranks(self) -> None:
        """Tell the cluster environment and the rank-zero helpers this process's rank."""
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(
                self.node_rank * self.num_processes + self.local_rank
            )
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)  # type: ignore[attr-defined]
        rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]

    def init_process_group(self) -> None:
        """The default process group over the cluster environment's ranks, unless it exists."""
        if dist.is_initialized():
            return
        env = self.cluster_environment
        assert env is not None
        os.environ["MASTER_ADDR"] = env.main_address
        os.environ["MASTER_PORT"] = str(env.main_port)
        device = self.root_device if self.root_device.type != "cpu" else None
        dist.init_process_group(
            self.backend(), rank=self.global_rank, world_size=self.world_size,
            timeout=self.timeout or default_pg_timeout, device_id=device,
        )  # fmt: skip

    @override
    def barrier(self, name: str | None = None) -> None:
        if dist.is_initialized():
            dist.barrier()

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not dist.is_initialized():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src)
        return box[0]

    @override
    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """The sum or mean over ranks of a detached copy (a DTensor's full value first: the
        loss under loss parallelism); the caller's tensor is never modified."""
        if not isinstance(tensor, torch.Tensor) or not dist.is_initialized():
            return tensor
        value = plain_tensor(tensor)
        mean = isinstance(reduce_op, str) and reduce_op.lower() in ("mean", "avg")
        if isinstance(reduce_op, str):
            op = getattr(dist.ReduceOp, "SUM" if mean else reduce_op.upper())
        else:
            op = reduce_op
        dist.all_reduce(value, op=op, group=group)
        if mean:  # gloo has no average
            value = (value / dist.get_world_size(group)).to(value.dtype)
        return value
