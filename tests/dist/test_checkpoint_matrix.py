"""The one checkpoint format across layouts: the layout-change matrix of docs/CHECKPOINTS.md in real
gloo runs (tests/dist/checkpoint_matrix_runs.py, each world size launched once). Every layout
writes the same names and shapes, every pair restores bitwise and continues with the same losses,
and a resume under another data-parallel size reads the same global batches. Bad checkpoints stop
train.py with one line and exit 2 before step 1: a truncated shard and a crafted `.metadata` (whose
command never runs) on both ranks of a 2-rank launch, a model of another size in one process.
(The format's one-process checks are tests/unit/test_checkpoint_format.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_dist.checkpoint.format import (
    tensor_shapes,
)
from lightning_dist.checkpoint.manifest import MANIFEST, open_manifest
from tests.repo import REPO_ROOT
from tests.unit.test_checkpoint_format import _saved

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "LIGHTNING_DIST_ALLOW_TARGETS": "tests."}

# --- one process: the manifest and the names ------------------------------------------------


# --- the layout-change matrix: 12 layouts, 23 pairs, three launches (one per world size) -----

SOURCES = {  # target: the checkpoints it resumes from (each saved at step 5 of 10)
    # Every layout is a source and a target; among the pairs: dp2 -> dp4 and dp4 -> dp1, pp
    # schedule v1 <-> v2, tp <-> pp, tp <-> fsdp, 3d <-> 1d, HSDP, and ZeRO-1 <-> one process
    # and FSDP2 and between its two layouts (its states written whole, read back as this rank's
    # slice).
    "single": ["fsdp_full_dp4", "hsdp_2x2", "ddp_zero1", "dp2xtp2_zero1"],
    "ddp_zero1": ["fsdp2"],
    "dp2xtp2_zero1": ["ddp_zero1"],
    "ddp": ["tp2", "pp2"],
    "fsdp2": ["pp2_v2", "dp2xtp2"],
    "tp2": ["fsdp2", "dp2xpp2"],
    "pp2": ["pp2_v2", "single"],
    "pp2_v2": ["pp2", "ddp"],
    # Four ranks cost the most on two cores: fewer pairs.
    "fsdp_full_dp4": ["ddp", "dp2xpp2"],
    "dp2xtp2": ["pp2_v2", "fsdp_full_dp4"],
    "dp2xpp2": ["tp2", "dp2xtp2"],
    "hsdp_2x2": ["pp2_v2"],
}
TWO_RANKS = ["ddp", "ddp_zero1", "fsdp2", "tp2", "pp2", "pp2_v2"]
FOUR_RANKS = ["fsdp_full_dp4", "dp2xtp2", "dp2xpp2", "hsdp_2x2", "dp2xtp2_zero1"]


def _targets(names: list[str]) -> list[str]:
    return [f"{t}:{','.join(SOURCES[t])}" for t in names]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, worlds):
    """The three runs of the matrix, each on the session's started world of its size (no
    launcher: the ranks are there, as under torchrun)."""
    out = tmp_path_factory.mktemp("matrix")
    started = time.perf_counter()
    run = "checkpoint_matrix_runs:main"
    worlds(1).run(run, str(out), ["single"])  # the 10-step reference
    worlds(2).run(run, str(out), TWO_RANKS)  # saves
    worlds(4).run(run, str(out), [*FOUR_RANKS, *_targets(FOUR_RANKS)])  # saves, then resumes
    worlds(2).run(run, str(out), _targets(["single", *TWO_RANKS]))  # resumes
    print(f"MATRIX wall {time.perf_counter() - started:.0f} s")
    runs: dict[str, list[dict]] = {}
    for path in sorted(out.glob("*.rank*.json")):
        runs.setdefault(path.name.split(".")[0], []).append(json.loads(path.read_text()))
    return out, runs


@pytest.mark.slow
def test_every_layout_writes_the_same_names_and_shapes(matrix):
    out, _ = matrix
    reference = tensor_shapes(out / "single" / "step5.ckpt")
    for name in [*TWO_RANKS, *FOUR_RANKS]:
        assert tensor_shapes(out / name / "step5.ckpt") == reference, name
        manifest = open_manifest(out / name / "step5.ckpt")
        assert manifest["step"] == 5 and manifest["data"]["samples_seen"] == 40, name


@pytest.mark.slow
def test_every_pair_restores_bitwise_and_continues_with_the_same_losses(matrix):
    _, runs = matrix
    reference = runs["single"][0]["losses"][5:]
    pairs, worst = 0, 0.0
    for target, sources in SOURCES.items():
        for source in sources:
            ranks = runs[f"{target}_from_{source}"]
            saved = set(ranks[0]["restored"]["saved_keys"])
            held = set().union(*(r["restored"]["keys"] for r in ranks))
            assert held == saved, (target, source, sorted(saved ^ held)[:5])  # every value held
            assert not [r["restored"]["differ"] for r in ranks if r["restored"]["differ"]]
            losses = ranks[0]["losses"]
            assert len(losses) == 5, (target, source)
            diff = max(abs(a - b) for a, b in zip(losses, reference, strict=True))
            assert diff <= 1e-4, (target, source, losses, reference)
            pairs, worst = pairs + 1, max(worst, diff)
    print(f"MATRIX {pairs} pairs bitwise, max loss difference {worst:.2e}")
    assert pairs == sum(map(len, SOURCES.values())) == 23


@pytest.mark.slow
@pytest.mark.parametrize(
    "run", ["fsdp_full_dp4_from_ddp", "single_from_fsdp_full_dp4"], ids=["dp2_to_dp4", "dp4_to_dp1"]
)
def test_a_resume_under_another_dp_size_reads_the_same_global_batches(matrix, run):
    _, runs = matrix
    reference = runs["single"][0]["ids"]
    seen: dict[str, set[int]] = {}
    for rank in runs[run]:
        for step, ids in rank["ids"].items():
            seen.setdefault(step, set()).update(ids)
    assert sorted(seen, key=int) == [str(s) for s in range(6, 11)]
    for step, ids in seen.items():
        assert sorted(ids) == sorted(reference[step]) and len(ids) == 8, step


# --- bad checkpoints through train.py: one line, exit 2, every rank ---------------------------


def _train(*overrides: str, tmp_path: Path, env=ENV) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(REPO_ROOT / "train.py"),
            "debug=fast",
            "logger=none",
            *overrides,
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _rank_env(rank: int, world: int) -> dict[str, str]:
    """What torchrun (or SLURM through Lightning) gives each rank; the port is never opened,
    since the checks run before any process group exists."""
    return {**ENV, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
            "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}  # fmt: skip


def _one_error_line(stderr: str, expected: str) -> None:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]


@pytest.mark.slow
def test_bad_checkpoints_stop_every_rank_with_one_line(matrix, tmp_path):
    """A truncated shard, both ranks of a 2-rank launch started as torchrun would: each says so
    in one line and exits 2. A checkpoint of another model size: one line, exit 2."""
    import shutil

    out, _ = matrix
    bad = tmp_path / "step5.ckpt"
    shutil.copytree(out / "ddp" / "step5.ckpt", bad)
    shard = next(bad.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-10])
    overrides = ["strategy=ddp", "hardware.devices=2", f"trainer.ckpt_path={bad}"]
    ranks = [_train(*overrides, tmp_path=tmp_path, env=_rank_env(r, 2)) for r in range(2)]
    wrong_size = _train(
        "model.dim=32", f"trainer.ckpt_path={out / 'single' / 'step5.ckpt'}", tmp_path=tmp_path
    )
    for proc in ranks:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 2 and "step 1" not in stdout, stderr[-3000:]
        _one_error_line(stderr, f"{shard.name} does not match its hash")
    stdout, stderr = wrong_size.communicate(timeout=300)
    assert wrong_size.returncode == 2 and "step 1" not in stdout, stderr[-3000:]
    _one_error_line(
        stderr,
        "model.tok_embeddings.weight has shape [512, 64] in the "
        "checkpoint but [512, 32] in this model",
    )


@pytest.mark.slow
def test_a_crafted_metadata_file_stops_every_rank_of_a_resume_and_runs_nothing(tmp_path):
    """A real checkpoint folder whose `.metadata` was replaced by a pickle that runs
    `touch <marker>`, its manifest rewritten to match (the hashes guard against damage, not
    against whoever can write the folder): both ranks of a 2-rank resume refuse it in one line,
    exit 2, and the command never runs."""
    from lightning_dist.checkpoint.manifest import write_manifest

    path, _, _ = _saved(tmp_path)  # the format's own folder: no training run needed
    marker = tmp_path / "marker"
    (path / ".metadata").write_bytes(f"cos\nsystem\n(V touch {marker}\ntR.".encode())
    write_manifest(
        path,
        {
            k: v
            for k, v in json.loads((path / MANIFEST).read_text()).items()
            if k not in ("format", "version", "files")
        },
    )
    open_manifest(path)  # the hashes match: only the restricted unpickler stands in the way
    overrides = ["strategy=ddp", "hardware.devices=2", f"trainer.ckpt_path={path}"]
    ranks = [_train(*overrides, tmp_path=tmp_path, env=_rank_env(r, 2)) for r in range(2)]
    for proc in ranks:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 2 and "step 1" not in stdout, stderr[-3000:]
        _one_error_line(stderr, "system, which no checkpoint metadata needs")
    assert not marker.exists(), "the crafted metadata ran its command"
