"""Cases that run `lightning_dist.train.train` inside the ranks of a `World` (tests/dist/world.py)."""

from __future__ import annotations

CASE_DEFAULTS = ["report=false"]
"""Overrides every case starts from, its own after them: no plots at the end (rank 0's
matplotlib, about 0.5 s a case while the other ranks wait; a case that checks the report says
`report=true`)."""


def case_config(overrides: list[str], run_dir: str):
    """The config a case trains: CASE_DEFAULTS, then `overrides`, in `run_dir`."""
    from lightning_dist.config import compose_config

    return compose_config([*CASE_DEFAULTS, *overrides, f"paths.output_dir={run_dir}"])


def train_case(overrides: list[str], run_dir: str) -> dict:
    """train(cfg) of the composed overrides in this rank; the summary every rank returns."""
    return train_config(case_config(overrides, run_dir))


def train_config(cfg) -> dict:
    """train(cfg) of a config composed once by the caller (tests/dist/conftest.py's `train_in`)
    and sent to every rank: the same config each rank would compose, without a Hydra
    composition per rank (about 0.2 s of a core each, 2026-12-06)."""
    from lightning_dist.train import train

    return train(cfg)


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
