"""The hang watchdog's plumbing (`callbacks/watchdog.py`): the heartbeat store every rank
joins, and how a failed collective tells that a peer went away."""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist


def lost_peer(exception: BaseException | None) -> bool:
    """A collective or point-to-point operation that failed because a peer went away: gloo
    raises a plain RuntimeError saying so (which the pipeline schedule wraps), torch a
    DistNetworkError; this exception or one it came from."""
    seen = set()
    while exception is not None and id(exception) not in seen:
        seen.add(id(exception))
        text = str(exception)
        if isinstance(exception, dist.DistNetworkError) or any(
            sign in text
            for sign in (
                "Connection closed by peer",
                "Connection reset by peer",
                "Broken pipe",
            )
        ):
            return True
        exception = exception.__cause__ or exception.__context__
    return False


def heartbeat_store(rank: int, interval: float, stall_seconds: float):
    """A TCPStore served by rank 0 on a free port of MASTER_ADDR, joined by every rank. A call
    to a frozen rank 0 waits until the guard thread ends the process (`stall_seconds`): a
    shorter timeout only has the client print C++ warnings as it retries."""
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    timeout = timedelta(seconds=max(5.0, stall_seconds + 4 * interval + 10))
    store = None
    if rank == 0:
        store = dist.TCPStore(host, 0, None, True, timeout=timeout, wait_for_workers=False)
    port = [store.port if store is not None else 0]
    dist.broadcast_object_list(port, src=0)
    if store is None:
        store = dist.TCPStore(host, port[0], None, False, timeout=timeout)
    return store
