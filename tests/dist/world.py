"""Ranks started once, cases looped inside: a world of gloo processes that outlives one test.

`World(size)` starts `size` processes that wait for cases. They are forked from one
multiprocessing fork server that has imported torch, Lightning and our package once (`PRELOAD`),
so a world of 8 costs one import instead of eight; the server itself never joins a process group.
`world.run("module:function", *args)` runs the function in every rank at once and returns the
rank-ordered list of what it returned. Each case sees the environment torchrun would give it
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, a fresh MASTER_PORT, TORCHELASTIC_RUN_ID), so a case
can call `train(cfg)` (Lightning then finds the processes it would otherwise start) or
`init_group()` for library-level code; whatever process group a case leaves is destroyed before
the next one, on every rank. Ranks that still run a gloo loop thread after that (a group that
something outside Python's collector keeps alive) are stopped, and the next case forks new
ones.

A case that raises on any rank fails with every rank's traceback. A case that does not finish
within `timeout` seconds (a rank stuck in a collective its peers never reach) fails naming the
ranks that did not answer; the world is then stopped and the next case starts a new one, so one
hang costs one case, never the session.
"""

from __future__ import annotations

import gc
import importlib
import multiprocessing as mp
import os
import random
import socket
import sys
import time
import traceback
from datetime import timedelta
from typing import Any

CASE_TIMEOUT_S = 600.0
POLLING_THREAD = "gloo_tcp_loop"
"""The name of gloo's socket loop thread, which wakes every few milliseconds even when idle. A
rank still holding one after its case (a group that outlived the case) is stopped then, and the
next case forks a new one (see `World.run`)."""
PRELOAD = ["world", "torch.distributed", "lightning.pytorch", "lightning_dist.run.build"]
"""What the fork server imports before it forks any rank."""


PORTS = range(20000, 32000)
"""Where `free_port` draws from: below Linux's ephemeral range (32768 and up), so no outgoing
connection of another test (gloo opens hundreds) takes the port between this check and the
listener's bind; a port the kernel hands out for bind(0) lies in that range and can."""


def free_port() -> int:
    """A port that nothing listens on now, drawn at random from `PORTS`."""
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.choice(PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORTS} after 100 draws")


def init_group(timeout_s: float = 120.0) -> None:
    """Inside a case: the default gloo group over the case's ranks (its own MASTER_PORT)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))


def _leave_groups() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        # torch's DTensor caches would hand this case's meshes, and their group names, to the
        # next case's equal meshes (lightning_dist._compat.clear_dtensor_caches)
        from lightning_dist._compat import clear_dtensor_caches

        clear_dtensor_caches()
    # A group lives (with its gloo loop threads) until nothing holds it: collect the case's
    # reference cycles (trainer, strategy, modules) now rather than at some later case.
    gc.collect()


def _serve(rank: int, size: int, conn, env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(size),
        LOCAL_WORLD_SIZE=str(size),
        GROUP_RANK="0",
        ROLE_RANK=str(rank),
        NODE_RANK="0",
        MASTER_ADDR="127.0.0.1",
    )
    while True:
        message = conn.recv()
        if message is None:  # the end: without gloo's C++ teardown (runtime/process_end.py)
            from lightning_dist.runtime.process_end import end_process

            end_process(0)
        target, args, kwargs, port, run_id = message
        os.environ["MASTER_PORT"] = str(port)
        os.environ["TORCHELASTIC_RUN_ID"] = run_id
        try:
            module, _, name = target.partition(":")
            result = getattr(importlib.import_module(module), name)(*args, **kwargs)
            reply = (True, result)
        except BaseException:  # noqa: BLE001 - reported to the parent with its traceback
            reply = (False, traceback.format_exc())
        try:
            _leave_groups()
        except Exception:  # noqa: BLE001
            pass
        conn.send(reply)


def _holds_polling_threads(proc) -> bool:
    """Whether a waiting rank still runs a gloo loop thread. The groups of an FSDP2 case outlive
    `destroy_process_group` and `gc.collect()`: FSDP's parameter groups stay alive, held
    through an autograd node by no Python root that 14 levels of referrers found (2026-12-03),
    and each group keeps a loop thread that polls: 0.75% of a core per rank and case, measured
    idle, and before this check (a restart at 48 threads) about a third of a core across the
    tier's waiting worlds. A restart costs a fork from the preloaded server: about 0.3 s for
    two ranks, measured."""
    try:
        tasks = os.listdir(f"/proc/{proc.pid}/task")
    except OSError:  # not Linux, or the rank is gone (the case will say so)
        return False
    for task in tasks:
        try:
            with open(f"/proc/{proc.pid}/task/{task}/comm") as f:
                if f.read().strip() == POLLING_THREAD:
                    return True
        except OSError:
            continue
    return False


class World:
    """`size` waiting gloo ranks; see the module doc."""

    def __init__(
        self,
        size: int,
        *,
        timeout: float = CASE_TIMEOUT_S,
        env: dict | None = None,
        keep_ranks: bool = False,
    ):
        """`keep_ranks`: never restart the ranks between cases, even when they hold polling
        threads (a test of what one process carries from one run to the next)."""
        self.size, self.timeout, self.keep_ranks = size, timeout, keep_ranks
        self.env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        self._procs: list = []
        self._conns: list = []
        self._cases = 0

    def _start(self) -> None:
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)  # no effect once the server runs
        for rank in range(self.size):
            parent, child = context.Pipe()
            proc = context.Process(
                target=_serve,
                args=(rank, self.size, child, self.env),
                daemon=True,
                name=f"world{self.size}-rank{rank}",
            )
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)

    def run(self, target: str, *args: Any, **kwargs: Any) -> list:
        """Run `target` ("module:function", importable in the ranks) on every rank; the list of
        its return values by rank. AssertionError with each failing rank's traceback."""
        if not self._procs:
            self._start()
        self._cases += 1
        message = (target, args, kwargs, free_port(), f"world-{os.getpid()}-{self._cases}")
        for conn in self._conns:
            conn.send(message)
        replies: dict[int, tuple[bool, Any]] = {}
        deadline = time.monotonic() + self.timeout
        for rank, conn in enumerate(self._conns):
            if conn.poll(max(0.0, deadline - time.monotonic())):
                try:
                    replies[rank] = conn.recv()
                except EOFError:
                    replies[rank] = (
                        False,
                        f"rank {rank} exited (status {self._procs[rank].exitcode})",
                    )
        missing = [r for r in range(self.size) if r not in replies]
        failed = {r: v for r, (ok, v) in replies.items() if not ok}
        if missing:  # a hung rank never reads the stop message: end the world at once
            self.close(kill=True)
        elif not self.keep_ranks and any(map(_holds_polling_threads, self._procs)):
            self.close()  # not left polling while it waits: see _holds_polling_threads
        if missing or failed:
            lines = [f"{target} on {self.size} ranks:"]
            if missing:
                lines.append(f"ranks {missing} did not finish within {self.timeout:.0f} s")
            lines += [f"--- rank {r} ---\n{text}" for r, text in sorted(failed.items())]
            raise AssertionError("\n".join(lines))
        return [replies[r][1] for r in range(self.size)]

    def close(self, *, kill: bool = False) -> None:
        """Stop the ranks: each is asked to return and given 10 s; `kill` ends them at once."""
        for conn in self._conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            if not kill:
                proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []


if __name__ == "__main__":
    sys.exit("tests/dist/world.py is a library for the tests of tests/dist")
