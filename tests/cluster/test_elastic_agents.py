"""Elastic resize by restart: one job of two torchrun agents (two gloo ranks each) on loopback,
started by `python -m lightning_dist.launch torchrun --nnodes=1:2` with `hardware.min_nodes=1`.

Node 1 (its agent and both its ranks) is SIGKILLed after step 6 (tests/faults.py
KillNodeAtStep); the surviving agent restarts its ranks as a one-node world of 2 ranks, which
resume from the newest checkpoint with gradient accumulation 2 instead of 1 (a shrunk world
sleeps after each step, SlowBelowWorld, so that it is still training when node 1 comes back).
Once it has trained two steps, a new agent for node 1 starts: the job grows back to 4 ranks
(the running ranks checkpoint on torchrun's SIGTERM) and finishes. Each rank records the
training-set indices of every micro-batch it reads (RecordSamples).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from lightning_dist.config import compose_config
from lightning_dist.lm.sampling import GlobalBatchSampler
from lightning_dist.run.parity_runs import max_relative_difference
from tests.dist import baselines
from tests.dist.world import free_port
from tests.repo import REPO_ROOT

pytestmark = pytest.mark.slow

STEPS = 40
KILL_AT = 6
REFERENCE = [
    "debug=fast",
    f"trainer.max_steps={STEPS}",
    "logger=none",
    "strategy=single",
    "hardware.devices=1",
]
JOB = [
    "debug=fast", f"trainer.max_steps={STEPS}", "logger=none", "strategy=ddp",
    "hardware.devices=2", "hardware.num_nodes=2", "hardware.min_nodes=1",
    "data.micro_batch_size=1", "trainer.checkpoint.every_n_train_steps=1", "trainer.resume=auto",
    "+callbacks.kill._target_=tests.faults.KillNodeAtStep", f"+callbacks.kill.step={KILL_AT}",
    "+callbacks.slow._target_=tests.faults.SlowBelowWorld", "+callbacks.slow.world_size=4",
    "+callbacks.slow.seconds=1.0", "+callbacks.record._target_=tests.faults.RecordSamples",
]  # fmt: skip
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}


def _agent(node: int, port: int, run_dir: Path, log: Path) -> subprocess.Popen:
    """One torchrun agent through our launcher (node 0 hosts the rendezvous), in its own
    process group, so that a lost node takes its agent and its ranks with it."""
    cmd = [
        sys.executable, "-m", "lightning_dist.launch", "torchrun", "--nnodes=1:2",
        "--nproc-per-node=2", "--max-restarts=3", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_dir.name}",
        f"--rdzv-conf=is_host={int(node == 0)},last_call_timeout=5",
        str(REPO_ROOT / "tests" / "toy_train.py"), *JOB, f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    with log.open("w") as out:
        return subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env=ENV,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _records(run_dir: Path) -> list[dict]:
    folder = run_dir / "samples"
    lines = [line for p in folder.glob("*.jsonl") for line in p.read_text().splitlines()]
    return [json.loads(line) for line in lines if line.endswith("}")]


def _until(condition, timeout: float, what: str, procs) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            for p in procs:
                _kill(p)
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.fixture(scope="module")
def elastic(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic")
    run_dir, port = root / "run", free_port()
    started = time.monotonic()
    node0 = _agent(0, port, run_dir, root / "node0.log")
    node1 = _agent(1, port, run_dir, root / "node1.log")
    procs = [node0, node1]
    _until(lambda: node1.poll() is not None, 300, "node 1 to be lost at step 6", procs)

    def shrunk_steps() -> int:
        return len({r["step"] for r in _records(run_dir) if r["world_size"] == 2})

    _until(lambda: shrunk_steps() >= 3, 300, "the 2-rank world to train", procs)
    node1_again = _agent(1, port, run_dir, root / "node1_again.log")
    procs.append(node1_again)
    try:
        codes = [node0.wait(timeout=400), node1_again.wait(timeout=60)]
    except subprocess.TimeoutExpired:
        for p in procs:
            _kill(p)
        codes = [node0.returncode, node1_again.returncode]
    print(f"ELASTIC job in {time.monotonic() - started:.0f} s")
    logs = {p.stem: p.read_text() for p in root.glob("*.log")}
    return codes, run_dir, logs


def _final_steps(records: list[dict]) -> dict[int, tuple[int, list[int]]]:
    """For each step, (world size, sorted sample ids) of the world that ran it last: a step
    redone after a restart counts once, as the last world trained it."""
    last = {r["step"]: r for r in sorted(records, key=lambda r: r["time"])}
    ids = defaultdict(list)
    for r in records:  # a world's records of one step lie within seconds; restarts take 20 s+
        final = last[r["step"]]
        if r["world_size"] == final["world_size"] and final["time"] - r["time"] < 10:
            ids[r["step"]].extend(r["ids"])
    return {s: (last[s]["world_size"], sorted(i)) for s, i in ids.items()}


def test_elastic_job_shrinks_grows_back_and_reads_every_sample_once(elastic):
    codes, run_dir, logs = elastic
    assert codes == [0, 0], f"exit codes {codes}\n" + "\n".join(
        f"--- {name}\n{text[-3000:]}" for name, text in logs.items()
    )
    steps = _final_steps(_records(run_dir))
    assert sorted(steps) == list(range(1, STEPS + 1))
    worlds = [steps[s][0] for s in sorted(steps)]
    # Step 6 ended as node 1 was lost, before its checkpoint: the 2-rank world redid it.
    assert worlds[: KILL_AT - 1] == [4] * (KILL_AT - 1) and 2 in worlds and worlds[-1] == 4, worlds
    # The uninterrupted run's global batches: one rank reading every sample of each step.
    data = compose_config(REFERENCE).data
    batch = data.global_batch_size
    sampler = GlobalBatchSampler(data.num_samples, batch, batch, 0, 1, seed=data.seed)
    expected = {s: sorted(sampler.step_indices(s - 1, 0)) for s in steps}
    differ = [s for s in steps if steps[s][1] != expected[s]]
    assert not differ, f"steps whose samples differ from the uninterrupted run: {differ}"
    summary = json.loads((run_dir / "summary.json").read_text())
    reference = baselines.reference(REFERENCE)["losses"]
    assert max_relative_difference([reference[-1]], [summary["losses"][-1]]) < 1e-4


def test_one_world_at_a_time_wrote_the_checkpoint_folder(elastic):
    _, run_dir, _ = elastic
    folder = run_dir / "checkpoints"
    writers = [json.loads(p.read_text()) for p in (folder / ".writers").glob("*.json")]
    sizes = [w["world_size"] for w in sorted(writers, key=lambda w: w["number"])]
    assert sizes[0] == 4 and 2 in sizes and sizes[-1] == 4, sizes
    manifests = [json.loads(p.read_text()) for p in folder.glob("step*.ckpt/manifest.json")]
    by_step = [m["writer"] for m in sorted(manifests, key=lambda m: m["step"])]
    assert by_step == sorted(by_step) and None not in by_step, by_step
