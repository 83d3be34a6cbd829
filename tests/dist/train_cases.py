"""Cases that run `lightning_dist.train.train` inside the ranks of a `World` (tests/dist/world.py)."""

from __future__ import annotations

CASE_DEFAULTS = ["report=false"]
"""Overrides every case starts from, its own after them: no plots at the end (rank 0's
matplotlib, about 0.5 s a case while the other ranks wait; a case that checks the report says
`report=true`)."""


def train_case(overrides: list[str], run_dir: str) -> dict:
    """train(cfg) of the composed overrides in this rank; the summary every rank returns."""
    from lightning_dist.config import compose_config
    from lightning_dist.train import train

    return train(compose_config([*CASE_DEFAULTS, *overrides, f"paths.output_dir={run_dir}"]))


def script_case(path: str, argv: list[str]) -> str:
    """`python PATH ARGV...` in this rank (its `main()`, as under torchrun); what it printed."""
    import contextlib
    import io
    import runpy
    import sys

    script = runpy.run_path(path, run_name="world_case")
    printed, before = io.StringIO(), sys.argv
    sys.argv = [path, *argv]
    try:
        with contextlib.redirect_stdout(printed):
            script["main"]()
    finally:
        sys.argv = before
    return printed.getvalue()
