"""Replica groups that heal live (`strategy=ft_hsdp`), over torchft. No Lightning here.

Each replica group is its own torch.distributed job (one torchrun) that shards the model with
FSDP2 over its ranks. torchft's Lighthouse (started by `python -m lightning_dist.launch
replicas`) forms a quorum of the groups present before every step; rank r of each group
all-reduces its gradient shards with rank r of the other groups of the quorum, and the step is
committed only when every rank of the group saw that all-reduce succeed. A group that fails
drops out of the next quorum, and the others go on without restarting. A relaunched group joins
a quorum and receives the model, the optimizer state and the training position from a peer
(torchft's checkpoint transport, over HTTP between the job's own processes: the payload is
unpickled, as torch.distributed's object collectives do).

Only the synchronous quorum is used: with torchft's asynchronous quorum, healing during FSDP2's
forward crashed in backward (torch 2.13, torchft 0.2.0).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import torch
import torch.distributed as dist
from torch import nn

from lightning_dist._compat import torchft_quorum_id
from lightning_dist.cluster.elastic import restart_attempt
from lightning_dist.parallel.gradient_reduction import local_tensor

log = logging.getLogger(__name__)

GROUP_ENV = "REPLICA_GROUP_ID"
"""This process's replica group, 0 .. replica_groups - 1 (set by the launcher)."""
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
"""The Lighthouse address, torchft's own variable (set by the launcher)."""
FIRST_QUORUM_PAUSE_S = 0.2
"""Between the first step's quorums while groups are still starting."""


class ReplicaGroupFellBehind(RuntimeError):
    """A running group was healed mid-run: it restarts, and heals again before step 1."""


class ReplicaGroupAlone(RuntimeError):
    """A relaunched group found no other group to heal from."""


class ReplicaGroupQuorumFailed(RuntimeError):
    """A step's quorum failed while the Lighthouse answers (a rank of this group, or the whole
    group, was frozen past strategy.ft_timeout_s): the group restarts and heals from a peer."""


class ReplicaGroupLeftBehind(RuntimeError):
    """A group away past `strategy.ft_timeout_s` (frozen, cut off) came back alone: the others
    trained on without it and have ended, so there is no newer state to heal from."""

    status = "left_behind"
    """summary.json's status of a run that stops on it (`train.py`)."""


class LighthouseLost(RuntimeError):
    """The torchft Lighthouse does not answer: no group can form a quorum (its host ended)."""

    status = "lighthouse_lost"
    """summary.json's status of a run that stops on it (`train.py`)."""


def lighthouse_answers(address: str, timeout_s: float = 3.0) -> bool:
    """Whether anything accepts a connection at the Lighthouse's `http://host:port`."""
    parsed = urlsplit(address if "://" in address else f"http://{address}")
    try:
        if parsed.port is None:
            return False  # an address without a port names nothing to connect to
        with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def replica_group_id(groups: int) -> int:
    """This process's replica group from the launcher's environment; ValueError when absent."""
    raw = os.environ.get(GROUP_ENV)
    if raw is None or LIGHTHOUSE_ENV not in os.environ:
        raise ValueError(
            f"strategy=ft_hsdp needs {GROUP_ENV} and {LIGHTHOUSE_ENV} in the environment: start "
            "the run with `python -m lightning_dist.launch replicas --groups N "
            "--nproc-per-group M <train.py overrides>` (docs/MULTINODE.md, live healing)"
        )
    if not raw.isdigit() or int(raw) >= groups:
        raise ValueError(f"{GROUP_ENV}={raw!r} is not a group of strategy.replica_groups={groups}")
    return int(raw)


LIGHTHOUSE_PROBE_S = 3.0
"""How long the check before launch waits for the Lighthouse to accept a connection."""


def check_lighthouse(address: str, timeout_s: float = LIGHTHOUSE_PROBE_S) -> None:
    """Before launch: ValueError in one line unless something accepts a TCP connection at the
    Lighthouse address (`TORCHFT_LIGHTHOUSE`) within `timeout_s`; without one, torchft's
    manager would retry for over a minute after every rank had started, then fail in a
    traceback."""

    parts = urlsplit(address if "://" in address else f"http://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number
        host = port = None
    if not host or not port:
        raise ValueError(
            f"{LIGHTHOUSE_ENV}={address!r} is not a Lighthouse address: give http://HOST:PORT "
            "(torchft_lighthouse binds [::]:29510 by default)"
        )
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
        raise ValueError(
            f"strategy=ft_hsdp: no torchft Lighthouse answers at {address} ({LIGHTHOUSE_ENV}: "
            f"{reason}); start the job with `python -m lightning_dist.launch replicas --groups "
            "N --nproc-per-group M <train.py overrides>`, which starts one, or start torchft's "
            f"own (`torchft_lighthouse --min_replicas 1 --bind [::]:{port}`) on {host}"
        ) from e


def training_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's shards of the parameters, buffers and optimizer state, as plain CPU tensors:
    what the same rank of a healing group loads with `load_training_state`."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return {
        "model": {k: local_tensor(v).detach().cpu().clone() for k, v in model.state_dict().items()},
        "optimizer": [
            {
                k: local_tensor(v).cpu().clone() if torch.is_tensor(v) else v
                for k, v in optimizer.state.get(p, {}).items()
            }
            for p in params
        ],
        "groups": [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups],
    }


@torch.no_grad()
def load_training_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Copy a peer's `training_state` into this rank's shards, in place (the same layout)."""
    mine = model.state_dict()
    if set(mine) != set(state["model"]):
        raise ValueError("the healing peer's model has other parameter names than this one")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if len(params) != len(state["optimizer"]):
        raise ValueError("the healing peer's optimizer has another number of parameters")
    # First, as its step may move parameters (an optimizer whose update ignores the lr):
    # the peer's values are copied over everything after it.
    _init_optimizer_state(
        optimizer, [p for p, s in zip(params, state["optimizer"], strict=True) if s]
    )
    for name, value in mine.items():
        local_tensor(value).copy_(state["model"][name])
    for param, saved in zip(params, state["optimizer"], strict=True):
        for key, value in saved.items():
            current = optimizer.state[param][key]
            if torch.is_tensor(current):
                local_tensor(current).copy_(value)
            else:
                optimizer.state[param][key] = value
    for group, saved in zip(optimizer.param_groups, state["groups"], strict=True):
        group.update(saved)


def _init_optimizer_state(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    """Create the optimizer's state tensors (a step with zero gradients and a zero learning
    rate, which changes no parameter) for `params` that have none yet."""
    missing = {id(p) for p in params if not optimizer.state.get(p)}
    if not missing:
        return
    saved_grads = {p: p.grad for g in optimizer.param_groups for p in g["params"]}
    saved_lrs = [g["lr"] for g in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
        for p in group["params"]:
            p.grad = torch.zeros_like(p) if id(p) in missing else None
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, saved_lrs, strict=True):
        group["lr"] = lr
    for p, grad in saved_grads.items():
        p.grad = grad


def _group_device() -> torch.device:
    """Where the group's collectives take their tensors: the current GPU under NCCL (never run
    here), the CPU under gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class ReplicaGroups:
    """torchft's Manager for one rank of one replica group: quorum, cross-group average,
    commit, and the state a healing peer receives (`state_fn` / `load_fn`)."""

    def __init__(
        self,
        *,
        group_id: int,
        groups: int,
        min_groups: int,
        timeout_s: float,
        state_fn: Callable[[], dict[str, Any]],
        load_fn: Callable[[dict[str, Any]], None],
    ) -> None:
        from torchft.manager import Manager
        from torchft.process_group import ProcessGroupGloo

        timeout = timedelta(seconds=timeout_s)
        # GPU note: NCCL (torchft's ProcessGroupNCCL) would be the GPU choice; never run here.
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=load_fn,
            state_dict=state_fn,
            min_replica_size=min_groups,
            use_async_quorum=False,
            timeout=timeout,
            quorum_timeout=timeout,
            connect_timeout=timeout,
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            replica_id=f"group_{group_id}",
            init_sync=False,
        )
        self.group_id = group_id
        self.groups = groups
        self.timeout_s = timeout_s
        self._last_quorum = (-1, time.monotonic())
        """(the id of the last quorum this group was in, when it returned: monotonic s)."""

    def quorum(self) -> int:
        """The quorum of the next step (a healing group loads its peer's state in here);
        returns the number of groups in it."""
        try:
            self.manager.start_quorum()
        except (ReplicaGroupFellBehind, ReplicaGroupAlone):
            raise  # from our own code (the healing's load)
        except Exception as e:  # torchft's TimeoutError after ft_timeout_s, among others
            address = os.environ.get(LIGHTHOUSE_ENV, "")
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            if not address or lighthouse_answers(address):
                raise ReplicaGroupQuorumFailed(
                    f"replica group {self.group_id}: the quorum failed after "
                    f"strategy.ft_timeout_s={self.timeout_s} ({type(e).__name__}: {first}); it "
                    "restarts (torchrun --max-restarts) and heals from a running group"
                ) from None
            raise LighthouseLost(
                f"replica group {self.group_id}: the torchft Lighthouse at {address} does not "
                f"answer (the quorum failed after strategy.ft_timeout_s={self.timeout_s}: "
                f"{first}); no group can train without it, so this group stops"
            ) from None
        present = self.manager.num_participants()
        self._check_not_left_behind(present)
        return present

    def _check_not_left_behind(self, present: int) -> None:
        """Refuse to train on alone after quorums were formed without this group.

        A group frozen past `ft_timeout_s` (SIGSTOP, a suspended machine) is dropped by the
        Lighthouse; the others train on and may end before it wakes. It would then be alone,
        at its old step, and train a second lineage of the model to the end, writing
        checkpoints with the same step numbers as the others'. The Lighthouse's quorum id tells
        it: a gap in the ids this group saw means quorums it was not in. A group whose peers
        merely failed sees no gap (it is in every quorum), so it trains on alone, as it should.
        """
        quorum_id, now = torchft_quorum_id(self.manager), time.monotonic()
        seen, since = self._last_quorum
        self._last_quorum = (quorum_id, now)
        # The quorum is the group's, so every rank of it takes this branch alike.
        if seen < 0 or quorum_id <= seen + 1 or present > 1 or self.groups == 1:
            return
        # A peer that formed a quorum alone while this group ran one slow step leaves a gap
        # too: left behind only when away past ft_timeout_s, by the group's longest clock (each
        # rank's own would split the group between raising and training).
        away = torch.tensor([now - since], dtype=torch.float64, device=_group_device())
        dist.all_reduce(away, op=dist.ReduceOp.MAX)
        if away.item() <= self.timeout_s:
            return
        raise ReplicaGroupLeftBehind(
            f"replica group {self.group_id} was away {away.item():.0f} s (frozen, cut off, or "
            f"slower than the others by more than strategy.ft_timeout_s={self.timeout_s}) while "
            f"they trained on without it ({quorum_id - seen - 1} quorum(s) formed without it) "
            "and ended, leaving no group to heal from; it stops rather than train a lineage of "
            "its own from its older step: resume the job from the last checkpoint of the group "
            "that went furthest"
        )

    def first_quorum(self) -> int:
        """The first step's quorum, with every group if they all come within the timeout (a
        group whose processes are still starting is waited for, so a job starts whole)."""
        # Every rank of the group takes the same quorums, so counting attempts (not reading
        # each rank's clock) keeps the ranks together.
        attempts = max(1, int(self.timeout_s / FIRST_QUORUM_PAUSE_S))
        present = self.quorum()
        while present < self.groups and self.manager.current_step() == 0:
            attempts -= 1
            if attempts <= 0:
                if restart_attempt():
                    raise ReplicaGroupAlone(
                        f"replica group {self.group_id} was relaunched, but no other group "
                        f"joined it within strategy.ft_timeout_s={self.timeout_s}: there is no "
                        "peer to heal from (the others have ended); restart the whole job "
                        "(trainer.resume=auto resumes each group from its checkpoint)"
                    )
                log.warning(
                    "Replica group %d starts with %d of %d groups: the others did not join "
                    "within strategy.ft_timeout_s=%s",
                    self.group_id,
                    present,
                    self.groups,
                    self.timeout_s,
                )
                break
            time.sleep(FIRST_QUORUM_PAUSE_S)
            present = self.quorum()
        return present

    @torch.no_grad()
    def average(self, tensors: list[torch.Tensor]) -> None:
        """Average `tensors` in place over the groups of the quorum (one all-reduce; a failure
        is recorded for `commit`, and the values are then not to be used)."""
        flat = torch.cat([local_tensor(t).reshape(-1).float() for t in tensors])
        self.manager.allreduce(flat).wait()
        offset = 0
        for t in tensors:
            piece = local_tensor(t)
            piece.copy_(flat[offset : offset + piece.numel()].view_as(piece))
            offset += piece.numel()

    def commit(self, problem: str | None = None) -> bool:
        """Agree with the group on whether the step commits: False when any rank's all-reduce
        failed or any rank has a `problem`."""
        if problem is not None:
            self.manager.report_error(RuntimeError(problem))
        return self.manager.should_commit()

    def set_step(self, step: int) -> None:
        """Count steps from `step` (the training step a resumed run restored), so that a
        group relaunched later heals from the newest state."""
        self.manager.load_state_dict(
            {"step": step, "batches_committed": self.manager.batches_committed()}
        )

    def participants(self) -> int:
        return self.manager.num_participants()

    def step(self) -> int:
        """Steps committed (the same count on every group of a quorum)."""
        return self.manager.current_step()

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)
