"""A stderr line leaves in one write, so lines of ranks that report together never merge."""

import io
import sys

from lightning_dist.run.errors import report_config_error
from lightning_dist.runtime.console import print_line


class RecordingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


def test_a_line_and_its_newline_are_one_write(monkeypatch):
    stream = RecordingStream()
    monkeypatch.setattr(sys, "stderr", stream)
    print_line("error: rank 0 stopped making progress")
    try:
        report_config_error("bad value x; set y")
    except SystemExit as e:
        assert e.code == 2
    assert stream.calls == [
        "error: rank 0 stopped making progress\n",
        "error: bad value x; set y\n",
    ]
