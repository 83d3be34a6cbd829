"""The whole test suite, in the order and with the parallelism that fits a 2-core machine.

    python scripts/run_tests.py [PYTEST_ARGS ...]

Four phases, one after another, each a `python -m pytest` of its own:

1. tests/e2e, tests/unit and tests/gpu together on three pytest-xdist workers (`--dist
   loadfile`: a file's tests stay on one worker, so its module fixtures run once). An e2e test
   mostly waits for a rank to import torch and Lightning (one core busy of two, measured
   2026-12-01: 1.14 cores on average over the e2e tier alone); the unit tier fills the other.
   The e2e files go first: workers take files in the order given, and the longest ones (a
   minute or more each) should not start last.
2. tests/cluster on three workers (`--dist loadfile`): its waves of jobs time detection and
   restarts against deadlines, and mostly wait (a slowed rank, a stall watched for, a requeue,
   a rendezvous): its process tree used 448 s of CPU in 547 s of wall time on two workers
   (measured 2026-12-06, under other load), under one core of two, which a third worker fills.
3. tests/dist on two workers (`--dist loadfile`, each with its own worlds of ranks): a world's
   ranks wait on each other's collectives, a fifth of the time here (measured 2026-12-03), which
   the other worker's ranks fill. Its tests marked `quiet` are left out of this phase;
4. ... and run alone last: they time something (a pipeline's bubble) that other processes'
   load would distort.

Each parallel phase hands its workers whole test modules, heaviest first, by the seconds each
module took in the last recorded run (tests/module_seconds.json; a module not listed there counts
as heavy, `UNKNOWN_SECONDS`), with pytest-xdist's own reordering (by number of tests) off: a
module of one two-minute test then starts first instead of last, when the other worker would
idle while it runs (measured 2026-12-03 on the cluster phase: 433 s wall for 737 s of test time
on two workers). `python scripts/run_tests.py --record-module-seconds` runs the whole suite and
rewrites that file.

`python -m pytest` runs the same tests one at a time (about 6 minutes longer). PYTEST_ARGS
(`-x`, `-k EXPR`, `-m EXPR`, ...) go to every phase (an `-m EXPR` narrows each phase's
own marker selection). At the end: each tier's tests and seconds, each
phase's wall time, the whole suite's, the 12 test modules with the most test time and the 25
slowest tests. Exits 1 if any phase failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from importlib.util import find_spec
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = [  # (name, pytest arguments, test folders, marker expression or None)
    ("e2e + unit + gpu, 3 workers", ["-n", "3"], ["tests/e2e", "tests/unit", "tests/gpu"], None),
    ("cluster, 3 workers", ["-n", "3"], ["tests/cluster"], None),
    ("dist, 2 workers", ["-n", "2"], ["tests/dist"], "not quiet"),
    ("quiet: timings, alone", [], ["tests/dist"], "quiet"),
]
SCHEDULING = ["--dist", "loadfile", "--no-loadscope-reorder"]
"""How a phase with workers hands them tests: whole modules, in the order given."""
MODULE_SECONDS = ROOT / "tests" / "module_seconds.json"
UNKNOWN_SECONDS = 60.0
"""A module missing from MODULE_SECONDS (a new one) is scheduled as if it took this long."""
RECORD_FLAG = "--record-module-seconds"
SLOWEST = 25
SLOWEST_FILES = 12


def _cases(junit: Path) -> list[tuple[float, str, str]]:
    """(seconds, tier, test id) of every test case a phase's junit file records."""
    if not junit.exists():
        return []
    out = []
    for case in ET.parse(junit).iter("testcase"):
        module = case.get("classname", "")
        tier = module.split(".")[1] if module.startswith("tests.") else "?"
        out.append((float(case.get("time", 0.0)), tier, f"{module}::{case.get('name')}"))
    return out


def slowest_files(cases: list[tuple[float, str, str]], top: int) -> list[tuple[float, str]]:
    """(seconds, module) of the `top` test modules with the most test time: what balances a
    phase's workers, which take whole files (`--dist loadfile`)."""
    by_file: dict[str, float] = {}
    for seconds, _, test in cases:
        module = test.split("::")[0]
        by_file[module] = by_file.get(module, 0.0) + seconds
    return sorted(((s, m) for m, s in by_file.items()), reverse=True)[:top]


def heaviest_first(folders: list[str], seconds: dict[str, float]) -> list[str]:
    """The test modules under `folders`, those that took longest first (ties and unknown
    modules in folder and name order; an unknown one counts `UNKNOWN_SECONDS`)."""
    files = [
        p.relative_to(ROOT).as_posix()
        for f in folders
        for p in sorted((ROOT / f).glob("test_*.py"))
    ]
    return sorted(files, key=lambda f: -seconds.get(_module(f), UNKNOWN_SECONDS))


def _module(path: str) -> str:
    """tests/dist/test_a.py -> tests.dist.test_a, the name junit files give a module."""
    return path.removesuffix(".py").replace("/", ".")


def recorded_seconds() -> dict[str, float]:
    return json.loads(MODULE_SECONDS.read_text()) if MODULE_SECONDS.exists() else {}


def _marker_expression(args: list[str]) -> tuple[list[str], str | None]:
    """PYTEST_ARGS without their `-m EXPR` (or `-mEXPR`), and EXPR: each phase ANDs it with its
    own marker selection instead of pytest letting the last `-m` win."""
    rest, asked = [], None
    it = iter(args)
    for arg in it:
        if arg == "-m":
            asked = next(it, None)
            if asked is None:
                raise SystemExit("error: -m needs a marker expression (-m 'not slow')")
        elif arg.startswith("-m") and not arg.startswith("--"):
            asked = arg[2:].removeprefix("=")
        else:
            rest.append(arg)
    return rest, asked


def main(args: list[str]) -> int:
    if find_spec("xdist") is None:
        print("error: pytest-xdist is not installed; fix: pip install -e '.[dev]'", file=sys.stderr)
        return 2
    record = RECORD_FLAG in args
    if record and args != [RECORD_FLAG]:
        print(
            f"error: {RECORD_FLAG} records the whole suite; it takes no other arguments "
            f"(given: {' '.join(a for a in args if a != RECORD_FLAG)})",
            file=sys.stderr,
        )
        return 2
    args = [a for a in args if a != RECORD_FLAG]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    args, asked = _marker_expression(args)
    seconds = recorded_seconds()
    started, failed, walls, cases = time.perf_counter(), [], [], []
    phase_cases: list[list[tuple[float, str, str]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, workers, folders, markers) in enumerate(PHASES):
            paths = (
                [*workers, *SCHEDULING, *heaviest_first(folders, seconds)] if workers else folders
            )
            junit = Path(tmp) / f"phase{i}.xml"
            print(f"== phase {i + 1} of {len(PHASES)}: {name}", flush=True)
            t0 = time.perf_counter()
            selection = " and ".join(f"({m})" for m in (markers, asked) if m)
            marker_args = ["-m", selection] if selection else []
            code = subprocess.call(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    *paths,
                    *marker_args,
                    f"--junitxml={junit}",
                    *args,
                ],
                cwd=ROOT,
                env=env,
            )
            walls.append((name, time.perf_counter() - t0, code))
            phase_cases.append(_cases(junit))
            cases += phase_cases[-1]
            if code not in (0, 5):  # 5: nothing collected (a -k that selects no test here)
                failed.append(name)
    total = time.perf_counter() - started
    print("\n== the whole suite")
    for tier in sorted({tier for _, tier, _ in cases}):
        mine = [s for s, t, _ in cases if t == tier]
        print(f"tier {tier}: {len(mine)} tests, {sum(mine):.0f} s of test time")
    for name, wall, code in walls:
        print(f"phase {name}: {wall:.0f} s wall, pytest exit {code}")
    print(f"{SLOWEST_FILES} test modules with the most test time:")
    for seconds, module in slowest_files(cases, SLOWEST_FILES):
        print(f"  {seconds:6.1f} s  {module}")
    print(f"{SLOWEST} slowest tests:")
    for seconds, _, test in sorted(cases, reverse=True)[:SLOWEST]:
        print(f"  {seconds:6.1f} s  {test}")
    if record and not failed:  # the parallel phases' cases: the seconds their workers share
        parallel = [c for c, (_, workers, _, _) in zip(phase_cases, PHASES, strict=True) if workers]
        parallel = [case for cs in parallel for case in cs]
        by_module = {m: round(t, 1) for t, m in slowest_files(parallel, len(parallel))}
        MODULE_SECONDS.write_text(json.dumps(dict(sorted(by_module.items())), indent=1) + "\n")
        print(f"wrote {MODULE_SECONDS.relative_to(ROOT)} ({len(by_module)} modules)")
    print(
        f"whole suite: {total:.0f} s of pytest ({total / 60:.1f} min), "
        f"{'FAILED: ' + ', '.join(failed) if failed else 'every phase passed'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
