"""One line on stderr in one write.

`print(text, file=sys.stderr)` writes the text and its newline separately; with unbuffered
streams (`PYTHONUNBUFFERED`, as launchers set) two ranks that report at the same moment into one
pipe or file then merge their lines ("...30 s)error: rank 0 ..."). `print_line` hands the whole
line, newline included, to the stream in one call, which is one `write` system call on an
unbuffered stream and atomic for lines under the pipe's 4 KiB.
"""

from __future__ import annotations

import os
import sys


def print_line(text: str) -> None:
    """Write `text` and a newline to stderr in one call, then flush."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def launch_rank_zero() -> bool:
    """True in the process that launches the run (and in global rank 0 under torchrun/SLURM)."""
    if "RANK" in os.environ:
        return os.environ["RANK"] == "0"
    if os.environ.get("SLURM_PROCID", "0") != "0":  # an srun task; Lightning sets RANK later
        return False
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def warn_once(message: str) -> None:
    """One `warning: ...` line on stderr, from the first process only."""
    if launch_rank_zero():
        print_line(f"warning: {message}")
