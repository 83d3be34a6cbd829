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


def ranks_of(cfg) -> int:
    """How many ranks `train.py` starts on this machine for the composed config `cfg`."""
    from lightning_dist.config import hardware_spec

    return 1 if cfg.strategy.name == "single" else hardware_spec(cfg).resolved_devices()


@pytest.fixture(scope="module")
def train_in(worlds):
    """`train_in(overrides, run_dir)`: train.py's run of `overrides` on the ranks of a started
    world of as many ranks as the run starts; rank 0's summary. The config is composed once,
    here, and sent to the ranks (tests/dist/train_cases.py's `train_config`)."""
    from train_cases import case_config

    def run(overrides: list[str], run_dir) -> dict:
        cfg = case_config(list(overrides), str(run_dir))
        return worlds(ranks_of(cfg)).run("train_cases:train_config", cfg)[0]

    return run
