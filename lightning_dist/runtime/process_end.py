"""How every process the project starts ends: work done, a bounded barrier, the group left, exit.

A gloo process can hang or abort *after* its work is done, in C++ destructors that run while
Python tears itself down:

- a hang: the DDP reducer is freed (garbage collection, at interpreter exit) while the main
  thread holds the GIL; it frees the last reference to its `ProcessGroupGloo`, whose destructor
  joins gloo's `pt_gloo_runloop` thread, and that thread waits for the GIL to release a tensor.
  Neither can go on. `destroy_process_group()` does not prevent it (the reducer keeps the group);
- an abort: "terminate called without an active exception" (SIGABRT) when a C++ `std::thread`
  that is still joinable is destroyed during the interpreter's teardown.

Neither can be fixed from Python while those destructors run, so they never run: `end_process`
runs what Python itself would run at exit (non-daemon threads joined, `atexit` handlers: W&B,
logging, multiprocessing's worker cleanup, ...), flushes stdout and stderr and then ends the
process with `os._exit(code)`. The operating system closes the sockets and frees the memory.
The exit status is the one the work gave (`code`), never a destructor's.

Before that, `end_barrier` (called once a job has finished, on every rank of it) waits for every
rank, bounded: a rank whose peer is gone prints one `warning:` line after `timeout_s` and goes
on to exit instead of waiting in gloo. The process group is destroyed where the process goes on
(between the jobs of a multirun: `lightning_dist.strategies.launch.end_job`); at the end of the
process the group is left to `os._exit`.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from datetime import timedelta

THREAD_JOIN_S = 30.0
"""How long the end of a process waits for each non-daemon thread (Python would wait forever)."""


def end_barrier(timeout_s: float) -> bool:
    """Every rank of the default group meets here, or `timeout_s` passes: True if they all came.
    With gloo, `monitored_barrier` names the ranks that did not come; other backends wait in a
    barrier bounded by the group's own timeout."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return True
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
        else:
            dist.barrier()
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(
            f"warning: rank {dist.get_rank()}: not every rank reached the end of the job within "
            f"{timeout_s:.0f} s ({first}); this rank exits without waiting for them",
            file=sys.stderr,
            flush=True,
        )
        return False
    return True


def end_process(code: int = 0) -> None:
    """End this process with status `code` after Python's own exit work, without the C++
    destructors of its teardown (see the module doc). Never returns."""
    try:
        current = threading.current_thread()
        for thread in threading.enumerate():
            if thread is not current and not thread.daemon and thread.is_alive():
                thread.join(THREAD_JOIN_S)
        atexit._run_exitfuncs()  # what Py_Finalize would run; it also clears them
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(code)


def exit_status(error: BaseException | None) -> int:
    """The exit status Python would give for `error` (None: 0): SystemExit's code, else 1."""
    if error is None:
        return 0
    if isinstance(error, SystemExit):
        if error.code is None:
            return 0
        if isinstance(error.code, int):
            return error.code
        print(error.code, file=sys.stderr)  # sys.exit("message") prints it and exits 1
        return 1
    if isinstance(error, KeyboardInterrupt):
        return 130
    return 1


def run_then_end(main, *args, **kwargs) -> None:
    """Call `main`, then `end_process` with the status it gave: its SystemExit's code, 0 when it
    returned, 1 (after the traceback, as Python prints it) when it raised."""
    try:
        main(*args, **kwargs)
    except BaseException as error:  # noqa: BLE001 - every way out gets the same ending
        if not isinstance(error, SystemExit | KeyboardInterrupt):
            import traceback

            traceback.print_exc()
        end_process(exit_status(error))
    end_process(0)
