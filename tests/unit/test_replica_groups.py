"""strategy=ft_hsdp in one process: the state a healing group receives, the launcher's and the
strategy's checks. The live run (two groups, a kill, a heal) is tests/cluster/test_live_healing.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_dist.cluster.replica_groups import (
    GROUP_ENV,
    LIGHTHOUSE_ENV,
    load_training_state,
    replica_group_id,
    training_state,
)
from lightning_dist.launch.replicas import exit_status, group_overrides
from lightning_dist.options import ReplicaGroupOptions


def _model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, optimizer


def _step(model, optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 8, generator=generator)
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()


def test_a_fresh_rank_loaded_with_a_peers_state_then_steps_bit_for_bit_like_it():
    peer, peer_opt = _model_and_optimizer(0)
    for seed in range(3):
        _step(peer, peer_opt, seed)
    peer_opt.param_groups[0]["lr"] = 3e-3  # as a scheduler would have set it
    fresh, fresh_opt = _model_and_optimizer(1)  # other weights, no optimizer state yet
    load_training_state(fresh, fresh_opt, training_state(peer, peer_opt))
    assert fresh_opt.param_groups[0]["lr"] == 3e-3
    _step(peer, peer_opt, 7)
    _step(fresh, fresh_opt, 7)
    for a, b in zip(peer.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(peer.parameters(), fresh.parameters(), strict=True):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(peer_opt.state[a][key], fresh_opt.state[b][key]), key


def test_the_state_is_plain_cpu_copies_and_a_model_of_other_names_is_refused():
    model, optimizer = _model_and_optimizer(0)
    _step(model, optimizer, 0)
    state = training_state(model, optimizer)
    weight = state["model"]["0.weight"]
    assert weight.device.type == "cpu" and weight.data_ptr() != model[0].weight.data_ptr()
    other, other_opt = nn.Linear(8, 4), torch.optim.AdamW(nn.Linear(8, 4).parameters())
    with pytest.raises(ValueError, match="other parameter names"):
        load_training_state(other, other_opt, state)


def test_the_group_comes_from_the_launchers_environment(monkeypatch):
    monkeypatch.delenv(GROUP_ENV, raising=False)
    monkeypatch.delenv(LIGHTHOUSE_ENV, raising=False)
    with pytest.raises(ValueError, match="python -m lightning_dist.launch replicas"):
        replica_group_id(2)
    monkeypatch.setenv(LIGHTHOUSE_ENV, "http://127.0.0.1:1")
    monkeypatch.setenv(GROUP_ENV, "2")
    with pytest.raises(ValueError, match="REPLICA_GROUP_ID='2' is not a group of strategy.replica"):
        replica_group_id(2)
    monkeypatch.setenv(GROUP_ENV, "1")
    assert replica_group_id(2) == 1


def test_the_launcher_sets_strategy_groups_and_ranks_and_refuses_a_disagreeing_override(capsys):
    assert group_overrides(["model=tiny", "hardware.devices=2"], 3, 2) == [
        "strategy=ft_hsdp",
        "strategy.replica_groups=3",
        "hardware.devices=2",
        "model=tiny",
    ]
    with pytest.raises(SystemExit) as exit_:
        group_overrides(["strategy=fsdp2"], 2, 2)
    assert exit_.value.code == 2
    assert (
        "strategy=fsdp2 disagrees with the launcher's strategy=ft_hsdp" in capsys.readouterr().err
    )


def test_a_group_ended_by_a_signal_is_a_failure_of_the_job():
    assert [exit_status(c) for c in (0, 1, -9, -15)] == [0, 1, 137, 143]


def test_replica_group_knobs_name_the_bad_value():
    with pytest.raises(ValueError, match=r"strategy.min_replica_groups=3 is more than"):
        ReplicaGroupOptions(replica_groups=2, min_replica_groups=3)
    with pytest.raises(ValueError, match=r"strategy.replica_groups=0 must be a whole number"):
        ReplicaGroupOptions(replica_groups=0)
    with pytest.raises(ValueError, match=r"strategy.replica_groups=2.5 must be a whole number"):
        ReplicaGroupOptions(replica_groups=2.5)


def test_gradient_accumulation_and_a_replicated_group_are_refused_before_any_process():
    from lightning_dist.strategies.ft_hsdp import FTHSDPStrategy

    run = {"devices": 2, "num_nodes": 1, "precision": "32-true", "accelerator": "cpu"}
    strategy = FTHSDPStrategy(replica_groups=2)
    strategy.check_run(**run, global_batch_size=8, micro_batch_size=2)  # 2 x 2 ranks x 2
    with pytest.raises(ValueError, match=r"no gradient accumulation.*per_rank_batch_size=4"):
        strategy.check_run(**run, global_batch_size=16, micro_batch_size=2)
    assert strategy.data_shares(strategy.layout_for(2, 1)) == 4
    with pytest.raises(ValueError, match="dp_replicate=2 must be 1 inside a group"):
        FTHSDPStrategy(dp_replicate=2).layout_for(4, 1)


def test_a_lost_lighthouse_is_told_from_a_slow_one():
    """A quorum that failed is a lost Lighthouse only when nothing accepts a connection at its
    address (cluster/replica_groups.py, LighthouseLost)."""
    import socket

    from lightning_dist.cluster.replica_groups import lighthouse_answers

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = f"http://127.0.0.1:{listening.getsockname()[1]}"
        assert lighthouse_answers(address)
    assert not lighthouse_answers(address)  # closed: the Lighthouse's process has ended
    assert not lighthouse_answers("not an address")


def test_only_a_gap_in_the_quorum_ids_while_alone_can_leave_a_group_behind():
    """A group is left behind (cluster/replica_groups.py, ReplicaGroupLeftBehind) only when
    quorums were formed without it (a gap in the Lighthouse's ids) and it is now alone: not at
    its first quorum, not alone after its peers failed (consecutive ids), not with a peer
    present. Those cases return before the group's collective; the one case reaches it (no
    process group here, so it fails there)."""
    import time

    from lightning_dist.cluster.replica_groups import ReplicaGroups

    class Manager:
        _quorum_id = 4

    groups = ReplicaGroups.__new__(ReplicaGroups)
    groups.manager, groups.groups, groups.group_id, groups.timeout_s = Manager(), 2, 1, 10.0
    groups._last_quorum = (-1, time.monotonic() - 100)
    groups._check_not_left_behind(1)  # the first quorum: no id seen before
    for quorum_id, present in ((5, 1), (6, 2), (8, 2), (9, 1)):
        Manager._quorum_id = quorum_id
        groups._last_quorum = (groups._last_quorum[0], time.monotonic() - 100)
        groups._check_not_left_behind(present)
    Manager._quorum_id = 11  # 10 formed without it, and it is alone: the group decides
    with pytest.raises(ValueError, match="process group"):
        groups._check_not_left_behind(1)
