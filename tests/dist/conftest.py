"""The gloo tier: worlds of ranks started once per module (tests/dist/world.py) and the stored
single-process references (tests/dist/baselines.py)."""

import pytest
from world import World


@pytest.fixture(scope="module")
def worlds():
    """`worlds(n)`: this module's world of n ranks, started on first use and stopped at the end."""
    started: dict[int, World] = {}

    def get(size: int) -> World:
        if size not in started:
            started[size] = World(size)
        return started[size]

    yield get
    for world in started.values():
        world.close()


@pytest.fixture(scope="module")
def train_in(worlds):
    """`train_in(overrides, run_dir)`: train.py's run of `overrides` on the ranks of a started
    world of `hardware.devices` ranks (1 when the strategy is single); rank 0's summary."""

    def run(overrides: list[str], run_dir) -> dict:
        size = 1
        for override in overrides:
            if override.startswith("hardware.devices="):
                size = int(override.split("=", 1)[1])
        if "strategy=single" in overrides:
            size = 1
        return worlds(size).run("train_cases:train_case", list(overrides), str(run_dir))[0]

    return run
