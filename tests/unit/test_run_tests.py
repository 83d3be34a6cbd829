"""scripts/run_tests.py's own logic, without running a phase: which tests each phase selects
when the caller passes a marker expression of their own."""

from __future__ import annotations

import importlib.util

import pytest

from tests.repo import REPO_ROOT


@pytest.fixture(scope="module")
def run_tests():
    spec = importlib.util.spec_from_file_location(
        "run_tests", REPO_ROOT / "scripts" / "run_tests.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("args", "rest", "asked"),
    [
        (["-x", "-m", "not slow", "-k", "tp"], ["-x", "-k", "tp"], "not slow"),
        (["-mslow"], [], "slow"),
        (["-m=slow"], [], "slow"),
        (["--maxfail=1", "--markers"], ["--maxfail=1", "--markers"], None),
    ],
)
def test_a_marker_expression_is_taken_out_of_the_arguments(run_tests, args, rest, asked):
    assert run_tests._marker_expression(args) == (rest, asked)


def test_a_dangling_m_stops_with_one_line(run_tests):
    with pytest.raises(SystemExit, match="-m needs a marker expression"):
        run_tests._marker_expression(["-x", "-m"])


def test_the_quiet_tests_are_left_out_of_the_parallel_dist_phase_and_run_alone(run_tests):
    dist = [(workers, m) for _, workers, folders, m in run_tests.PHASES if "tests/dist" in folders]
    assert [m for _, m in dist] == ["not quiet", "quiet"]
    assert dist[1][0] == []  # no xdist workers: the machine to itself


def test_workers_get_the_heaviest_modules_first_and_unknown_ones_count_as_heavy(run_tests):
    recorded = {
        "tests.cluster.test_slurm": 199.0,
        "tests.cluster.test_elastic_agents": 125.0,
        "tests.cluster.test_process_ends": 35.0,
    }
    order = run_tests.heaviest_first(["tests/cluster"], recorded)
    assert order[:2] == ["tests/cluster/test_slurm.py", "tests/cluster/test_elastic_agents.py"]
    assert order[-1] == "tests/cluster/test_process_ends.py"  # the only one under 60 s
    assert sorted(order) == sorted(
        p.relative_to(REPO_ROOT).as_posix()
        for p in (REPO_ROOT / "tests" / "cluster").glob("test_*.py")
    )


def test_recording_takes_no_other_arguments(run_tests, capsys):
    assert run_tests.main(["--record-module-seconds", "-x"]) == 2
    assert "takes no other arguments (given: -x)" in capsys.readouterr().err


def test_the_slowest_files_sum_their_tests(run_tests):
    cases = [
        (3.0, "dist", "tests.dist.test_a::one"),
        (4.0, "dist", "tests.dist.test_a::two"),
        (5.0, "e2e", "tests.e2e.test_b::one"),
        (1.0, "unit", "tests.unit.test_c::one"),
    ]
    assert run_tests.slowest_files(cases, 2) == [
        (7.0, "tests.dist.test_a"),
        (5.0, "tests.e2e.test_b"),
    ]


def test_test_modules_have_unique_basenames_so_plain_pytest_collects_every_tier():
    # pytest imports test modules by basename where a folder has no __init__.py: two files named
    # alike in two tiers stop `python -m pytest` at collection.
    names = [p.name for p in (REPO_ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
