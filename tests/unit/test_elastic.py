"""Elastic jobs in one process: each torchrun round's node count, the settings our torchrun
launcher sets, and the fence that lets one world at a time write a checkpoint folder. The job
itself (two agents, a node lost and back) is tests/cluster/test_elastic_agents.py."""

from __future__ import annotations

import json

import pytest

from lightning_dist.checkpoint.fence import FencedOut, FolderFence
from lightning_dist.hardware import UNSHARED_STORE, HardwareSpec
from lightning_dist.launch.torchrun import torchrun_environment

ELASTIC = HardwareSpec(devices=2, num_nodes=4, min_nodes=2)


def test_a_round_takes_its_node_count_from_torchrun():
    assert ELASTIC.this_round({"GROUP_WORLD_SIZE": "3"}).num_nodes == 3
    assert list(ELASTIC.node_counts()) == [2, 3, 4]
    assert ELASTIC.this_round({}).num_nodes == 4  # outside torchrun: planned for the most
    fixed = HardwareSpec(devices=2, num_nodes=2)
    assert fixed.this_round({"GROUP_WORLD_SIZE": "1"}) is fixed  # not elastic: checked later
    assert list(fixed.node_counts()) == [2]


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"GROUP_WORLD_SIZE": "1"},
            "torchrun started this round on 1 node(s), outside "
            "hardware.min_nodes=2 to hardware.num_nodes=4; start torchrun with --nnodes=2:4",
        ),
        (
            {"GROUP_WORLD_SIZE": "3", "TORCHELASTIC_USE_AGENT_STORE": "True"},
            "python -m lightning_dist.launch torchrun",
        ),
    ],
)
def test_a_round_outside_the_range_or_on_the_shared_store_is_refused(environ, message):
    with pytest.raises(ValueError) as e:
        ELASTIC.this_round(environ)
    assert message in str(e.value)


def test_our_torchrun_gives_each_round_its_own_store():
    assert torchrun_environment({"PATH": "/bin", UNSHARED_STORE: "0"}) == {
        "PATH": "/bin",
        UNSHARED_STORE: "1",
    }


def test_the_newest_world_holds_the_folder_and_an_older_one_is_fenced_out(tmp_path):
    fence = FolderFence(tmp_path / "checkpoints")
    assert fence.holder() == 0 and fence.numbers() == []
    first = fence.claim({"world_size": 4, "num_nodes": 2})
    fence.check(first, fence.holder())  # holds it: no error
    second = FolderFence(tmp_path / "checkpoints").claim({"world_size": 2, "num_nodes": 1})
    assert (first, second, fence.holder()) == (1, 2, 2)
    with pytest.raises(FencedOut) as e:
        fence.check(first, fence.holder())
    assert "is now written by world 2 (2 ranks on 1 node(s)" in str(e.value)
    assert "this world 1 (4 ranks on 2 node(s)" in str(e.value)


def test_a_torchrun_restart_of_a_fenced_out_world_does_not_claim_the_folder_back(tmp_path):
    fence = FolderFence(tmp_path / "checkpoints")
    first = fence.claim({"world_size": 2, "run_id": "job-a"})
    fence.claim({"world_size": 2, "run_id": "job-b"})  # a split-off copy took the folder over
    assert fence.fenced_out_run("job-a") is None  # not fenced out until its next save says so
    fence.mark_fenced_out(first)
    assert fence.fenced_out_run("job-a") == first  # its restarts (same run id) refuse
    assert fence.fenced_out_run("job-b") is None and fence.fenced_out_run(None) is None
    assert fence.numbers() == [1, 2]  # the mark is no claim


def test_two_worlds_racing_for_one_number_get_two(tmp_path):
    fence = FolderFence(tmp_path)
    fence.claim({"world_size": 2})
    # Another world created number 2 between this world's read of the holder and its claim.
    (tmp_path / ".writers" / "2.json").write_text(json.dumps({"world_size": 4, "number": 2}))
    original = fence.holder
    fence.holder = lambda: 1  # what this world read before the other one claimed
    assert fence.claim({"world_size": 2}) == 3
    fence.holder = original
    assert fence.numbers() == [1, 2, 3]


def test_a_round_also_checks_the_node_counts_it_is_not(monkeypatch, tmp_path):
    """A 1-node round of a 1:2 job whose batch the 2-node round could not split stops now, not
    when the job grows (6 sequences over 2 ranks divide; over 4 they do not)."""
    from lightning_dist.config import compose_config
    from lightning_dist.run.plan import plan_run

    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")
    overrides = ["debug=fast", "strategy=ddp", "hardware.devices=2", "hardware.num_nodes=2",
                 "hardware.min_nodes=1", "data.global_batch_size=6",
                 f"paths.output_dir={tmp_path}"]  # fmt: skip
    with pytest.raises(ValueError) as e:
        plan_run(compose_config(overrides))
    assert str(e.value).startswith(
        "an elastic round on 2 of hardware.min_nodes=1 to hardware.num_nodes=2 nodes fails: "
    )
    assert "data.global_batch_size=6" in str(e.value)
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    overrides[-2] = "data.global_batch_size=8"
    assert plan_run(compose_config(overrides)).num_nodes == 2


def test_checkpoints_of_a_replaced_world_are_passed_over(tmp_path):
    """World 1 saved step 7 after world 2 had resumed from step 5: a later resume skips it."""
    from lightning_dist.checkpoint.store import latest_checkpoint

    folder = tmp_path / "checkpoints"
    fence = FolderFence(folder)
    fence.claim({"world_size": 4, "resumed_from": 0})
    fence.claim({"world_size": 2, "resumed_from": 5})
    for step, writer in ((5, 1), (6, 2), (7, 1)):
        path = folder / f"step{step}.ckpt"
        path.mkdir()
        for name in (".metadata", "meta.pt"):
            (path / name).write_bytes(b"")
        (path / "manifest.json").write_text(json.dumps({"step": step, "writer": writer}))
    limits = fence.replaced_after()  # world 1 replaced after step 5; world 2 not replaced
    assert limits == {1: 5, 2: float("inf")}
    assert 7 > limits[1] and not 5 > limits[1] and not 6 > limits[2]
    point = latest_checkpoint(folder)
    assert point.path == folder / "step6.ckpt"
    assert "skipped step7.ckpt, saved by a world that had been replaced" in point.describe()


def test_a_claim_without_its_record_is_named(tmp_path):
    fence = FolderFence(tmp_path)
    (tmp_path / ".writers").mkdir()
    (tmp_path / ".writers" / "3.json").write_text("{}")  # no start time, no sizes
    assert fence.describe(3) == "world 3"
    with pytest.raises(FencedOut, match="no longer holds this world's claim"):
        fence.check(4, fence.holder())
