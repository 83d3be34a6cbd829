"""`python -m lightning_dist.launch torchrun <torchrun arguments>`: torchrun with the settings an
elastic job (`--nnodes=MIN:MAX`, `hardware.min_nodes`) needs, so that nobody has to know them.

Today that is one: torchrun's rendezvous store is not shared with the workers
(`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`). On the shared store, a node joining a running job
deadlocks both agents (`DistStoreError: wait timeout`), measured with torch 2.13 on two agents;
with its own store per round, each round's rank 0 hosts the workers' store. Every other
argument is torchrun's own, passed on unchanged (`torchrun --help`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from lightning_dist.hardware import UNSHARED_STORE
from lightning_dist.runtime.quiet import quiet_native_logs


def torchrun_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with the elastic settings; a value the user set for them is overridden."""
    return {**environ, UNSHARED_STORE: "1"}


def run_torchrun(argv: list[str]) -> None:
    """Run torchrun's own entry point in this process with `argv` and the settings above."""

    quiet_native_logs()  # torchrun and its ranks: no C++ stack dumps (runtime/quiet.py)
    os.environ.update(torchrun_environment(os.environ))
    from torch.distributed.run import main

    main(argv)
