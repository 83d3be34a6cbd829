"""Joining the default process group so that torchrun's restarts work.

torchrun (c10d rendezvous) shares its rendezvous TCPStore with the workers by default, and
torch's env:// rendezvous then connects every worker to that store without a per-attempt key
prefix (torch 2.13 `_create_c10d_store`: "We create a new TCPStore for every retry"), but the
shared store lives as long as the agent. After a restart, gloo's pairing keys of the failed
attempt are still there: a new rank reads its peer's old address and fails with "Connection
refused" (or waits). Before Lightning initialises the process group, we initialise it ourselves
with the same store under a prefix naming the restart attempt, so each attempt has its own keys.
Outside torchrun's shared store this does nothing and Lightning initialises as usual.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def restart_attempt() -> int:
    """torchrun's restart count of this process's workers: 0 in the first attempt."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def init_process_group_for_attempt(backend: str, timeout: timedelta) -> bool:
    """Initialise the default process group in this restart attempt's key space; True if done."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or dist.is_initialized():
        return False
    attempt = restart_attempt()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        False,
        timeout=timeout,
    )
    options = {}
    if backend == "nccl":
        options["device_id"] = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"lightning_dist/attempt_{attempt}", store),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        **options,
    )
    return True
