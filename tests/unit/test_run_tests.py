"""scripts/run_tests.py's own logic, without running a phase: which tests each phase selects
when the caller passes a marker expression of their own."""

from __future__ import annotations

import importlib.util

import pytest

from lightning_dist.parity import REPO_ROOT


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
    phases = {name: (paths, markers) for name, paths, markers in run_tests.PHASES}
    dist = [(paths, m) for paths, m in phases.values() if "tests/dist" in paths]
    assert [m for _, m in dist] == ["not quiet", "quiet"]
    alone = dist[1][0]
    assert "-n" not in alone  # no xdist workers: the machine to itself


def test_the_slowest_files_sum_their_tests(run_tests):
    cases = [
        (3.0, "dist", "tests.dist.test_a::one"),
        (4.0, "dist", "tests.dist.test_a::two"),
        (5.0, "e2e", "tests.e2e.test_b::one"),
        (1.0, "unit", "tests.unit.test_c::one"),
    ]
    assert run_tests.slowest_files(cases, 2) == [(7.0, "tests.dist.test_a"),
                                                 (5.0, "tests.e2e.test_b")]  # fmt: skip
