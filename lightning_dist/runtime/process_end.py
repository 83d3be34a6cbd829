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
runs what Python itself would run at exit (the threading module's exit hooks, which stop idle
`concurrent.futures` workers, then non-daemon threads joined, then `atexit` handlers: W&B,
logging, multiprocessing's worker cleanup, ...), flushes stdout and stderr (Python's and C's)
and then ends the process with `os._exit(code)`. The operating system closes the sockets and
frees the memory. The exit status is the one the work gave (`code`), never a destructor's. A
non-daemon thread still running after `THREAD_JOIN_S` is cut off (Python would wait forever).

Before that, `end_barrier` (called once a job has finished, on every rank of it) waits for every
rank, bounded: a rank whose peer is gone prints one `warning:` line after `timeout_s` and goes
on to exit instead of waiting in gloo. The process group is destroyed where the process goes on
(between the jobs of a multirun: `lightning_dist.strategies.launch.end_job`); at the end of the
process it is left to `os._exit` (`ending()` tells the exit hook that would destroy it).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from datetime import timedelta

from lightning_dist._compat import run_atexit_handlers, run_thread_exit_hooks
from lightning_dist.runtime.console import print_line

THREAD_JOIN_S = 30.0
"""How long the end of a process waits for each non-daemon thread (Python would wait forever)."""


_ending: list[bool] = []


def ending() -> bool:
    """True once `end_process` has begun: exit hooks then leave the process group alone."""
    return bool(_ending)


def end_barrier(timeout_s: float) -> bool:
    """Every rank of the default group meets here, or `timeout_s` passes: True if they all came.
    gloo's `monitored_barrier` names the ranks that did not come. Under another backend (NCCL:
    its barrier cannot be bounded, a missing peer ends in its watchdog's abort) the ranks meet
    in a gloo group made for this barrier."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return True
    timeout = timedelta(seconds=timeout_s)
    try:
        group = None
        if dist.get_backend() != "gloo":
            group = dist.new_group(backend="gloo", timeout=timeout)
        dist.monitored_barrier(group=group, timeout=timeout)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print_line(
            f"warning: rank {dist.get_rank()}: not every rank reached the end of the job within "
            f"{timeout_s:.0f} s ({first}); this rank exits without waiting for them"
        )
        return False
    return True


def end_torchrun_agent() -> None:
    """A failure that no restart can mend: SIGKILL the torchrun agent that started this rank,
    before this rank exits (strategy=ft_hsdp: the Lighthouse is gone, and a relaunched group
    would refuse to start without it; or a relaunched group found no running group to heal
    from). Otherwise the agent relaunches the group up to `--max-restarts` times, each relaunch
    failing the same way, and then prints its `ChildFailedError` traceback. The agent's own
    status is then 137; its ranks end by themselves (torchrun starts each in a session of its
    own). Nothing happens outside torchrun."""
    parent = os.getppid()
    if "TORCHELASTIC_RUN_ID" not in os.environ or parent <= 1:
        return
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            command = f.read()
    except OSError:
        return
    if b"torch.distributed.run" in command or b"torchrun" in command:
        try:
            os.kill(parent, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    try:  # C's stdio buffers too (a library's output written from C)
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def end_process(code: int = 0, signum: int | None = None) -> None:
    """End this process with status `code` (or, given `signum`, by that signal with its default
    action, as Python ends on an unhandled KeyboardInterrupt) after Python's own exit work,
    without the C++ destructors of its teardown (see the module doc). Never returns."""
    _ending.append(True)
    try:
        run_thread_exit_hooks()  # what threading's shutdown runs first
        current = threading.current_thread()
        for thread in threading.enumerate():
            if thread is not current and not thread.daemon and thread.is_alive():
                thread.join(THREAD_JOIN_S)
        run_atexit_handlers()  # what Py_Finalize would run; it also clears them
    finally:
        _flush_output()
        if signum is not None:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
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
        print_line(str(error.code))  # sys.exit("message") prints it and exits 1
        return 1
    if isinstance(error, KeyboardInterrupt):
        return 128 + signal.SIGINT
    return 1


def run_then_end(main, *args, **kwargs) -> None:
    """Call `main`, then `end_process` with the status it gave: its SystemExit's code, 0 when it
    returned; an exception is reported through `sys.excepthook`, as Python reports it (so the
    hooks W&B installs see it), and gives 1, or, for KeyboardInterrupt, SIGINT's end."""
    try:
        main(*args, **kwargs)
    except BaseException as error:  # noqa: BLE001 - every way out gets the same ending
        if not isinstance(error, SystemExit):
            sys.excepthook(type(error), error, error.__traceback__)
        interrupted = isinstance(error, KeyboardInterrupt)
        end_process(exit_status(error), signum=signal.SIGINT if interrupted else None)
    end_process(0)
