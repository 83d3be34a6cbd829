"""One line on stderr in one write.

`print(text, file=sys.stderr)` writes the text and its newline separately; with unbuffered
streams (`PYTHONUNBUFFERED`, as launchers set) two ranks that report at the same moment into one
pipe or file then merge their lines ("...30 s)error: rank 0 ..."). `print_line` hands the whole
line, newline included, to the stream in one call, which is one `write` system call on an
unbuffered stream and atomic for lines under the pipe's 4 KiB.
"""

from __future__ import annotations

import sys


def print_line(text: str) -> None:
    """Write `text` and a newline to stderr in one call, then flush."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
