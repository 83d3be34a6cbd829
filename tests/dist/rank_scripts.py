"""Run a tests/<name>.py rank script on 2 gloo ranks under torchrun; return the JSON it wrote."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_two_ranks(script: str, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    # --standalone: a free port of its own, so two jobs started at once by two pytest workers
    # never share torchrun's default port 29500 and its store. (The gloo "Received data size
    # doesn't match" first blamed on that came from actmem_ranks.py's ranks taking different
    # numbers of steps; fixed there.)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(Path(__file__).with_name(script)), str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(out.read_text())
