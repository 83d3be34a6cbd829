"""Two nodes on one machine: two torchrun agents (c10d rendezvous over loopback), each starting
two gloo ranks of one `python train.py ... hardware.num_nodes=2 hardware.devices=2` job.

The jobs (ddp, fsdp2 HSDP, 3d tp2 x pp2) run once, concurrently, with a single-node 4-rank run
of the 3d layout and a job whose node count is wrong; the tests share them and compare with the
stored one-process reference (tests/dist/baselines.py). Each rank learns its node from torchrun's GROUP_RANK (lightning_dist/cluster/nodes.py).
The same jobs on four GPUs with NCCL are written but skipped without them. (The node map's
checks in one process are tests/unit/test_node_placement.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from lightning_dist.cluster.nodes import (
    INTER_NODE,
    INTRA_NODE,
)
from lightning_dist.run.parity_runs import max_relative_difference
from tests.dist import baselines
from tests.dist.world import free_port
from tests.repo import REPO_ROOT

TOLERANCE = 1e-4
BASE = ["debug=fast", "trainer.max_steps=4"]
TWO_NODES = ["hardware.num_nodes=2", "hardware.devices=2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
THREE_D = ["strategy=3d", "strategy.tp=2", "strategy.pp=2"]
JOBS = {
    "ddp": ["strategy=ddp"],
    "fsdp2_hsdp": ["strategy=fsdp2"],  # dp_replicate defaults to one replica per node
    "3d_tp2_pp2": [*THREE_D, "logger=wandb"],
}
# The groups each job's DeviceMesh (or, for DDP, its layout) must hold, and their link.
EXPECTED_MESH = {
    "ddp": {"dp_replicate": ([[0, 1, 2, 3]], INTER_NODE)},
    "fsdp2_hsdp": {
        "dp_replicate": ([[0, 2], [1, 3]], INTER_NODE),
        "dp_shard": ([[0, 1], [2, 3]], INTRA_NODE),
    },
    "3d_tp2_pp2": {"pp": ([[0, 2], [1, 3]], INTER_NODE), "tp": ([[0, 1], [2, 3]], INTRA_NODE)},
}


class Job(NamedTuple):
    codes: list[int]
    """Exit codes of its processes (the two agents, or the one train.py)."""
    output: str
    summary: dict | None
    run_dir: Path


def torchrun_node(
    node: int, port: int, overrides: list[str], run_dir: Path, ranks: int = 2
) -> list[str]:
    """The command of one agent; node 0 hosts the rendezvous store, as on two machines."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--nproc-per-node={ranks}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_dir.name}",
        f"--rdzv-conf=is_host={int(node == 0)}", str(REPO_ROOT / "train.py"), *overrides,
        f"hydra.run.dir={run_dir}",
    ]  # fmt: skip


def _start(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """Start `cmd` in its own process group (an agent and its ranks end together)."""
    with log.open("w") as out:
        return subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env=env or ENV,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Start every job at once; return {name: Job}."""
    root = tmp_path_factory.mktemp("multinode")
    plan: dict[str, list[list[str]]] = {}
    for name, overrides in JOBS.items():
        port = free_port()
        plan[name] = [
            torchrun_node(n, port, [*BASE, *TWO_NODES, *overrides], root / name) for n in (0, 1)
        ]
    port = free_port()  # two nodes of one rank started, but the config says one node of two
    wrong = [*BASE, "strategy=ddp", "hardware.devices=2"]
    plan["wrong_nodes"] = [
        torchrun_node(n, port, wrong, root / "wrong_nodes", ranks=1) for n in (0, 1)
    ]
    train = [sys.executable, str(REPO_ROOT / "train.py"), *BASE]
    plan["3d_one_node"] = [
        [*train, *THREE_D, "hardware.devices=4", f"hydra.run.dir={root / '3d_one_node'}"]
    ]
    started = time.perf_counter()
    procs = {
        name: [_start(cmd, root / f"{name}.{i}.log") for i, cmd in enumerate(cmds)]
        for name, cmds in plan.items()
    }
    results = {}
    for name, group in procs.items():
        codes = [_wait(p, max(1.0, 600 - (time.perf_counter() - started))) for p in group]
        output = "".join((root / f"{name}.{i}.log").read_text() for i in range(len(group)))
        path = root / name / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else None
        results[name] = Job(codes, output, summary, root / name)
    print(f"MULTINODE all jobs in {time.perf_counter() - started:.0f} s")
    return results


def _finished(runs, name: str) -> dict:
    job = runs[name]
    assert job.codes == [0] * len(job.codes) and job.summary, (
        f"{name}: {job.codes}\n{job.output[-4000:]}"
    )
    return job.summary


@pytest.mark.slow
@pytest.mark.parametrize("name", list(JOBS))
def test_two_nodes_match_one_process(name, runs):
    reference = baselines.reference([*BASE, "strategy=single"])  # stored: tests/dist
    summary = _finished(runs, name)
    diff = max_relative_difference(reference["losses"], summary["losses"])
    print(
        f"MULTINODE {name}: max relative loss difference {diff:.3e} over {summary['steps']} steps"
    )
    assert summary["world_size"] == 4 and summary["steps"] == 4
    assert diff <= TOLERANCE, (reference["losses"], summary["losses"])


@pytest.mark.slow
def test_two_nodes_match_one_node_of_four_ranks(runs):
    """The same 3d layout on one node of four ranks computes the very same losses."""
    one_node = _finished(runs, "3d_one_node")
    two_nodes = _finished(runs, "3d_tp2_pp2")
    diff = max_relative_difference(one_node["losses"], two_nodes["losses"])
    print(f"MULTINODE 3d_tp2_pp2 vs one node of 4 ranks: {diff:.3e}")
    assert diff <= 1e-6, (one_node["losses"], two_nodes["losses"])
    assert one_node["nodes"]["num_nodes"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", list(JOBS))
def test_tp_and_hsdp_shards_stay_inside_a_node_and_the_rest_cross(name, runs):
    nodes = _finished(runs, name)["nodes"]
    assert nodes["num_nodes"] == 2 and nodes["source"] == "torchrun GROUP_RANK"
    assert nodes["node_of_rank"] == [0, 0, 1, 1] and nodes["local_rank_of_rank"] == [0, 1, 0, 1]
    assert nodes["ranks_of_node"] == [[0, 1], [2, 3]]
    mesh = {dim: (v["groups"], v["link"]) for dim, v in nodes["mesh"].items()}
    assert mesh == EXPECTED_MESH[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(JOBS))
def test_communication_is_split_by_link(name, runs):
    comm = _finished(runs, name)["comm"]
    links = {link for _, link in EXPECTED_MESH[name].values()}
    for rank in comm["per_rank"]:
        by_link = rank["comm_seconds_by_link"]
        assert links <= set(by_link) <= {INTRA_NODE, INTER_NODE, "unattributed"}, by_link
        assert all(by_link[link] > 0 for link in links), by_link
    assert comm["comm_seconds_by_link"][INTER_NODE] > 0


@pytest.mark.slow
def test_the_run_report_names_the_links(runs):
    from lightning_dist.run.report_pages import markdown_summary

    text = markdown_summary(_finished(runs, "3d_tp2_pp2"), [])
    assert "| nodes | 2, pp inter-node, tp intra-node |" in text, text
    assert "| comm time by link | inter-node " in text and "intra-node " in text, text


@pytest.mark.slow
def test_wandb_records_the_nodes_and_the_split(runs):
    from wandb_records import history, records

    _finished(runs, "3d_tp2_pp2")
    (log,) = runs["3d_tp2_pp2"].run_dir.glob("wandb/offline-run-*/run-*.wandb")
    rows = [r for r in history(log) if "comm/inter_node_seconds" in r]
    assert len(rows) == 1 and rows[0]["comm/intra_node_seconds"] > 0, rows
    items = {}
    for record in records(log):
        if record.WhichOneof("record_type") == "summary":
            items.update({i.key: json.loads(i.value_json) for i in record.summary.update})
    assert items["summary/nodes"]["node_of_rank"] == [0, 0, 1, 1], items.get("summary/nodes")


@pytest.mark.slow
def test_a_wrong_node_count_stops_every_rank_with_one_line(runs):
    codes, output, summary, _ = runs["wrong_nodes"]
    errors = [x for x in output.splitlines() if x.startswith("error:")]
    assert summary is None and all(code != 0 for code in codes), output[-3000:]
    assert len(errors) == 2, output[-3000:]  # one per rank
    assert all("set hardware.num_nodes=2 hardware.devices=1" in e for e in errors), errors
    assert "exitcode  : 2" in output, output[-3000:]
    # torchrun's agents print their own ChildFailedError; no rank prints a traceback of ours.
    assert "lightning_dist/" not in output and "NodePlacementError" not in output, output[-3000:]


# --- the same on GPUs (NCCL): written for a 4-GPU machine, never run on one yet ---------------


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.cuda.device_count() < 4,
    reason="needs 4 CUDA GPUs: two simulated nodes of two, each agent on its own pair",
)
@pytest.mark.parametrize("name", list(JOBS))
def test_two_nodes_on_gpus_with_nccl(name, tmp_path):
    gpu = [*BASE, "hardware=gpu", "trainer.precision=32-true"]
    single = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "train.py"),
            *gpu,
            "strategy=single",
            "hardware.devices=1",
            f"hydra.run.dir={tmp_path / 'single'}",
        ],
        cwd=REPO_ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert single.returncode == 0, single.stderr[-3000:]
    port, run_dir = free_port(), tmp_path / name
    overrides = [*gpu, *TWO_NODES, *(o for o in JOBS[name] if not o.startswith("logger="))]
    agents = [
        _start(
            torchrun_node(n, port, overrides, run_dir),
            tmp_path / f"{n}.log",
            env={**ENV, "CUDA_VISIBLE_DEVICES": "0,1" if n == 0 else "2,3"},
        )
        for n in (0, 1)
    ]
    codes = [_wait(agent, 600) for agent in agents]
    output = "".join((tmp_path / f"{n}.log").read_text() for n in (0, 1))
    assert codes == [0, 0], output[-4000:]
    reference = json.loads((tmp_path / "single" / "summary.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert max_relative_difference(reference["losses"], summary["losses"]) <= TOLERANCE
    mesh = {dim: (v["groups"], v["link"]) for dim, v in summary["nodes"]["mesh"].items()}
    assert mesh == EXPECTED_MESH[name]
