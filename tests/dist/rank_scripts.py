"""Run a tests/dist/<name>.py rank script (its `main(out)`) on 2 gloo ranks and return the JSON
it wrote: under torchrun, for what needs processes of their own (how they end), or on the
session's started world of 2 ranks (tests/dist/world.py), which saves an interpreter per rank."""

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
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(Path(__file__).with_name(script)),
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(out.read_text())


def run_in_world(worlds, script: str, out: Path) -> dict:
    """`script`'s `main(out)` on every rank of `worlds(2)` (the `worlds` fixture), as torchrun
    would run it; the JSON it wrote."""
    worlds(2).run(f"{Path(script).stem}:main", str(out))
    return json.loads(out.read_text())
