"""Elastic jobs in one process: each torchrun round's node count, the settings our torchrun
launcher sets, and the fence that lets one world at a time write a checkpoint folder. The job
itself (two agents, a node lost and back) is tests/cluster/test_elastic.py."""

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
        ({"GROUP_WORLD_SIZE": "1"}, "torchrun started this round on 1 node(s), outside "
         "hardware.min_nodes=2 to hardware.num_nodes=4; start torchrun with --nnodes=2:4"),
        ({"GROUP_WORLD_SIZE": "3", "TORCHELASTIC_USE_AGENT_STORE": "True"},
         "python -m lightning_dist.launch torchrun"),
    ],
)  # fmt: skip
def test_a_round_outside_the_range_or_on_the_shared_store_is_refused(environ, message):
    with pytest.raises(ValueError) as e:
        ELASTIC.this_round(environ)
    assert message in str(e.value)


def test_our_torchrun_gives_each_round_its_own_store():
    assert torchrun_environment({"PATH": "/bin", UNSHARED_STORE: "0"}) == {
        "PATH": "/bin", UNSHARED_STORE: "1"
    }  # fmt: skip


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
