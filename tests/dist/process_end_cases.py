"""Cases of tests/dist/test_process_group_end.py, run inside the ranks of a `World`."""

import contextlib
import io
import os
import time


def end_barrier_without_rank_one(timeout_s: float) -> tuple[bool | None, float, str]:
    """Rank 0 waits at the end barrier for a rank 1 that never comes (it sleeps past the
    timeout instead): what end_barrier returned, how long it took and what it printed."""
    from world import init_group

    from lightning_dist.runtime.process_end import end_barrier

    init_group()
    if int(os.environ["RANK"]) == 1:
        time.sleep(timeout_s + 2)
        return None, 0.0, ""
    printed = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stderr(printed):
        came = end_barrier(timeout_s)
    return came, time.monotonic() - started, printed.getvalue()


def end_barrier_with_every_rank() -> bool:
    from world import init_group

    from lightning_dist.runtime.process_end import end_barrier

    init_group()
    return end_barrier(30)
