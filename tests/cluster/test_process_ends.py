"""Every process ends: the short form of bench/process_ends.py (one run of each kind: the raw loop
under torchrun with ddp and fsdp2, train.py on 2 ranks), with no hang, abort, failure or process
left behind. The 50-run loop is the benchmark's default."""

import subprocess
import sys

import pytest

from tests.repo import REPO_ROOT

pytestmark = pytest.mark.slow


def test_short_jobs_end_with_status_zero_and_leave_nothing_behind():
    result = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "process_ends.py"),
            "--runs",
            "1",
            "--steps",
            "5",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(result.stdout)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    rows = [
        line
        for line in result.stdout.splitlines()
        if line.startswith("| raw-") or line.startswith("| train ")
    ]
    assert len(rows) == 3 and all("| 1 | 1 | 0 | 0 | 0 | 0 |" in row for row in rows), rows
