"""The gloo tier: worlds of ranks started once per session (tests/dist/world.py) and the stored
single-process references (tests/dist/baselines.py)."""

import pytest
from world import World


@pytest.fixture(scope="session")
def worlds():
    """`worlds(n)`: the world of n ranks, started on first use and stopped at the end of the
    session: every module of the tier shares it (a case leaves no process group behind, and each
    run seeds its own randomness), so each world size costs one start."""
    started: dict[int, World] = {}

    def get(size: int) -> World:
        if size not in started:
            started[size] = World(size)
        return started[size]

    def alone(size: int) -> World:
        """A new world of `size` ranks with no other world running: for a measurement that
        other processes would disturb (waiting ranks are restarted rather than left holding
        gloo's polling threads, world.py, but a fresh world is the clean room)."""
        for world in started.values():
            world.close()
        started.clear()
        return get(size)

    get.alone = alone
    yield get
    for world in started.values():
        world.close()


def ranks_of(overrides: list[str]) -> int:
    """How many ranks `train.py OVERRIDES` starts on this machine (the composed config's)."""
    from lightning_dist.config import compose_config, hardware_spec

    cfg = compose_config([*overrides, "paths.output_dir=unused"])
    return 1 if cfg.strategy.name == "single" else hardware_spec(cfg).resolved_devices()


@pytest.fixture(scope="module")
def train_in(worlds):
    """`train_in(overrides, run_dir)`: train.py's run of `overrides` on the ranks of a started
    world of as many ranks as the run starts; rank 0's summary."""

    def run(overrides: list[str], run_dir) -> dict:
        return worlds(ranks_of(overrides)).run("train_cases:train_case", list(overrides),
                                               str(run_dir))[0]  # fmt: skip

    return run
