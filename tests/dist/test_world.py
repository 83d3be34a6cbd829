"""The rank harness itself: results by rank, every rank's traceback, a hang bounded and survived."""

import pytest
from world import World


@pytest.fixture(scope="module")
def world():
    w = World(2, timeout=20)
    yield w
    w.close()


def test_cases_run_on_every_rank_in_one_world(world):
    assert world.run("world_cases:all_reduce_rank") == [3.0, 3.0]
    assert world.run("world_cases:group_left_by_the_last_case") == [False, False]
    first = list(world._procs)
    assert world.run("world_cases:all_reduce_rank") == [3.0, 3.0]
    assert world._procs == first  # the same processes: started once


def test_a_failing_rank_is_reported_with_its_traceback(world):
    with pytest.raises(AssertionError, match=r"(?s)--- rank 1 ---.*ValueError: rank one refuses"):
        world.run("world_cases:fail_on_rank_one")
    assert world.run("world_cases:all_reduce_rank") == [3.0, 3.0]


def test_a_hang_fails_one_case_and_the_next_case_gets_a_new_world():
    world = World(2, timeout=5)
    try:
        with pytest.raises(AssertionError, match=r"ranks \[0, 1\] did not finish within 5 s"):
            world.run("world_cases:rank_zero_waits_alone")
        assert world.run("world_cases:all_reduce_rank") == [3.0, 3.0]
    finally:
        world.close()
