"""A run's name and home, through real train.py processes: stopped by SIGTERM or by Ctrl-C
(SIGINT to the whole process group, as a terminal sends it) after step 8, the same command plus
`trainer.resume=auto` (no `hydra.run.dir`) finds the run in `outputs/<run name>`, says which
checkpoint it resumes, and ends with the whole run's record: 30 losses equal to an uninterrupted
run's, the metrics CSV holding every step from 1, the segments of both attempts; the checkpoint
folder keeps `trainer.checkpoint.keep_last=3` step folders; a fresh start in an occupied home
stops in one line. The three first runs go side by side (one process each), then the two
resumes."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading

import pytest

from tests.repo import REPO_ROOT

STEPS = 30
COMMAND = ["debug=fast", "strategy=single", "hardware.devices=1", f"trainer.max_steps={STEPS}",
           "trainer.checkpoint.every_n_train_steps=5", "trainer.log_every_n_steps=1",
           "callbacks.progress.plain_every_n_steps=1"]  # fmt: skip
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def start(cwd, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "train.py"), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV,
        start_new_session=True,
    )


def stop_after_step(process: subprocess.Popen, step: int, signum: int, out: list[str]) -> None:
    """Read the console; once it shows `step <step>/`, send `signum` (SIGINT to the process
    group, as Ctrl-C in a terminal does; others to the process)."""
    sent = False
    for line in process.stdout:
        out.append(line)
        if not sent and line.startswith(f"step {step}/"):
            if signum == signal.SIGINT:
                os.killpg(process.pid, signum)
            else:
                process.send_signal(signum)
            sent = True
    process.wait(timeout=600)


def finish(process: subprocess.Popen) -> str:
    out, _ = process.communicate(timeout=600)
    return out


@pytest.mark.slow
def test_stopped_run_resumes_in_its_home_with_its_whole_history(tmp_path):
    runs = {"reference": [], "term": [], "int": []}
    procs = {name: start(tmp_path, *COMMAND, f"run_name={name}") for name in runs}
    threads = [
        threading.Thread(target=stop_after_step, args=(procs[name], 8, signum, runs[name]))
        for name, signum in (("term", signal.SIGTERM), ("int", signal.SIGINT))
    ]
    for thread in threads:
        thread.start()
    reference_out = finish(procs["reference"])
    for thread in threads:
        thread.join(timeout=600)
    assert procs["reference"].returncode == 0, reference_out[-2000:]
    assert procs["term"].returncode == 75, "".join(runs["term"])[-2000:]
    assert procs["int"].returncode == 130, "".join(runs["int"])[-2000:]
    for name in ("term", "int"):
        console = "".join(runs[name])
        assert re.search(
            r"continue this run with: python \S*train.py .*trainer.resume=auto", console
        ), console[-2000:]
        stopped = json.loads((tmp_path / "outputs" / name / "summary.json").read_text())
        assert stopped["status"] == "preempted" and stopped["preempted_at_step"] >= 8
        assert stopped["val_steps"] == []  # no validation after the preemption checkpoint

    # A fresh start where a run lives already: one line, exit 2, nothing touched.
    again = subprocess.run(
        [sys.executable, str(REPO_ROOT / "train.py"), *COMMAND, "run_name=term"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert again.returncode == 2, again.stderr[-2000:]
    error = [line for line in again.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "this run term would write over an earlier run" in error[0]
    assert "trainer.resume=auto" in error[0]

    resumed = {
        name: start(tmp_path, *COMMAND, f"run_name={name}", "trainer.resume=auto")
        for name in ("term", "int")
    }
    reference = json.loads((tmp_path / "outputs" / "reference" / "summary.json").read_text())
    assert len(reference["losses"]) == STEPS
    for name, process in resumed.items():
        out = finish(process)
        assert process.returncode == 0, out[-2000:]
        home = tmp_path / "outputs" / name
        line = [x for x in out.splitlines() if x.startswith("trainer.resume=auto: resuming")]
        assert len(line) == 1 and f"{home}/checkpoints/step" in line[0], out[-2000:]
        summary = json.loads((home / "summary.json").read_text())
        first = summary["first_step"]
        assert first >= 5 and f"step{first}.ckpt" in line[0]
        assert len(summary["losses"]) == STEPS
        worst = max(abs(a - b) for a, b in zip(summary["losses"], reference["losses"], strict=True))
        assert worst <= 1e-6, (name, worst)
        segments = summary["segments"]
        assert [(s["first_step"], s["last_step"]) for s in segments] == [
            (1, first),
            (first + 1, STEPS),
        ]
        total = summary["wall_seconds"] + segments[0]["wall_seconds"]
        assert summary["total_wall_seconds"] == pytest.approx(total, abs=0.5)
        with (home / "metrics" / "metrics.csv").open(newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("train/loss")]
        assert [int(r["step"]) + 1 for r in rows] == list(range(1, STEPS + 1))
        logged = [float(r["train/loss"]) for r in rows]
        assert max(abs(a - b) for a, b in zip(logged, summary["losses"], strict=True)) <= 1e-6
        kept = sorted(p.name for p in (home / "checkpoints").glob("step*"))
        assert kept == ["step20.ckpt", "step25.ckpt", "step30.ckpt"], kept
    kept = sorted(
        p.name for p in (tmp_path / "outputs" / "reference" / "checkpoints").glob("step*")
    )
    assert kept == ["step20.ckpt", "step25.ckpt", "step30.ckpt"], kept
    assert "removed step5.ckpt (trainer.checkpoint.keep_last=3)" in reference_out
