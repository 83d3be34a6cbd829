"""The unit tier: one process, no subprocess, no process group. A test that starts one fails with
where it belongs; the run ends with the unit tests that took over `SLOW_UNIT_S` seconds, so the
tier stays fast without a timing assertion."""

import multiprocessing.process
import subprocess

import pytest

SLOW_UNIT_S = 2.0
_slow: list[tuple[float, str]] = []


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(
            f"a unit test {what} (tests/unit is one process): move it to tests/dist (gloo ranks), "
            "tests/e2e (train.py and the CLIs) or tests/cluster"
        )

    return refuse


@pytest.fixture(autouse=True)
def _one_process(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("starts a subprocess"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("starts a process"))
    monkeypatch.setattr(dist, "init_process_group", _refuse("starts a process group"))


@pytest.fixture
def fitted_trainers(monkeypatch) -> list:
    """The Lightning Trainers that `train(cfg)` fits during the test, in order (and Lightning's
    seed variables, which `seed_everything` sets, restored after it)."""
    import lightning as L

    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):
        monkeypatch.setenv(name, "0")
    trainers = []
    fit = L.Trainer.fit

    def recording_fit(self, *args, **kwargs):
        trainers.append(self)
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(L.Trainer, "fit", recording_fit)
    return trainers


def pytest_runtest_logreport(report):
    # The hook sees every report of the session (tests/e2e too, when both tiers run together).
    if (
        report.when == "call"
        and report.nodeid.startswith("tests/unit/")
        and (report.duration > SLOW_UNIT_S)
    ):
        _slow.append((report.duration, report.nodeid))


def pytest_terminal_summary(terminalreporter):
    if _slow:
        terminalreporter.section(f"unit tests over {SLOW_UNIT_S:.0f} s (keep tests/unit fast)")
        for seconds, nodeid in sorted(_slow, reverse=True):
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")
