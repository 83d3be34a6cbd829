"""Surviving the cluster, in one process: the NaN guard and the checkpoint scan. The finiteness
check is exact at the edges of the range (bf16 and empty tensors too); the skip policy leaves the
weights untouched and stops after too many bad steps in a row; the stop policy names the step;
the scan behind trainer.resume=auto skips a partial checkpoint and says so. (The real gloo runs of
train.py: NaN stop, preemption, the hang watchdog, torchrun restarts and asynchronous saves, are
tests/cluster/test_resilience_cluster.py.)"""

from __future__ import annotations

import os

import lightning as L
import pytest
import torch
from torch import nn

from lightning_dist.callbacks.nan_guard import NonFiniteError, NonFiniteGuard, _all_finite
from lightning_dist.checkpoint.store import latest_checkpoint

# --- the NaN guard --------------------------------------------------------------------------


class NaNAt(L.LightningModule):
    """A linear model whose loss is NaN at the optimizer steps in `bad_steps` (1-based)."""

    def __init__(self, bad_steps: set[int]) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.bad_steps = bad_steps
        self.weights_after: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        return loss * float("nan") if self.global_step + 1 in self.bad_steps else loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.weights_after.append(self.layer.weight.detach().clone())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.1, weight_decay=0.1)


def _fit(module: L.LightningModule, callback: L.Callback | list, steps: int = 6) -> None:
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(64, 4)), batch_size=4
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        callbacks=callback if isinstance(callback, list) else [callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, data)


def test_the_finiteness_check_is_exact_at_the_edges_of_the_range():
    """Huge finite gradients are finite (no overflow to a false alarm); one inf, one NaN, or an
    inf and a -inf that would cancel are not; bf16 and empty tensors are handled."""
    big = torch.full((1 << 16,), torch.finfo(torch.float32).max)
    assert _all_finite([big, -big, torch.zeros(3)])
    assert _all_finite([torch.full((1000,), 3e38, dtype=torch.bfloat16), torch.empty(0)])
    assert _all_finite([])
    for bad in (float("inf"), float("nan")):
        grad = torch.ones(10_000)
        grad[1234] = bad
        assert not _all_finite([torch.ones(5), grad])
    assert not _all_finite([torch.tensor([float("inf"), -float("inf")])])
    assert not _all_finite([torch.tensor([1.0, float("nan")], dtype=torch.bfloat16)])


def test_nan_policy_skip_leaves_the_weights_untouched_and_goes_on():
    module, guard = NaNAt({3}), NonFiniteGuard("skip", max_skips=2)
    _fit(module, guard)
    assert guard.skipped_steps == [3]
    after = module.weights_after
    assert torch.equal(after[2], after[1])  # step 3 changed nothing, weight decay included
    assert not torch.equal(after[3], after[2]) and len(after) == 6
    assert all(torch.isfinite(w).all() for w in after)


def test_nan_policy_skip_stops_after_too_many_in_a_row():
    with pytest.raises(NonFiniteError, match=r"3 steps in a row \(last: step 4\)"):
        _fit(NaNAt({2, 3, 4}), NonFiniteGuard("skip", max_skips=2))


def test_nan_policy_stop_names_the_step():
    module = NaNAt({2})
    with pytest.raises(NonFiniteError, match="the loss is not finite at step 2"):
        _fit(module, NonFiniteGuard("stop"))
    assert len(module.weights_after) == 1 and torch.isfinite(module.weights_after[0]).all()


def test_a_finished_fit_leaves_nothing_global_holding_its_model(tmp_path):
    """The requeue-signal holder gives up the Preemption callback when its fit ends: held, it
    kept the trainer, the model and its process groups alive in a process that trains again
    (a Hydra multirun's rank 0; the test harness's ranks)."""
    import gc
    import weakref

    from lightning_dist.callbacks.preemption import Preemption
    from lightning_dist.runtime import requeue_signal

    module, preemption = NaNAt(set()), Preemption(tmp_path)
    requeue_signal.hand_over(preemption)
    _fit(module, preemption, steps=2)
    assert requeue_signal._preemption is None
    gone = weakref.ref(module)
    del module, preemption
    gc.collect()
    assert gone() is None


def test_preemption_turns_lightnings_per_batch_sigterm_broadcast_off_for_the_fit(tmp_path):
    """Preemption owns SIGTERM during the fit and agrees on it over the ranks at each step's
    end, so Lightning's broadcast of rank 0's SIGTERM flag before every batch (a collective
    per step) is a no-op then, and Lightning's own again after the fit."""
    from lightning_dist.callbacks.preemption import Preemption

    class Probe(L.Callback):
        during: list = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.during.append(trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor)

    probe, preemption = Probe(), Preemption(tmp_path)
    module = NaNAt(set())
    _fit(module, [preemption, probe], steps=2)
    loop = module.trainer.fit_loop.epoch_loop
    assert len(probe.during) == 2 and probe.during[0]() is None
    assert probe.during[0].__qualname__ != type(loop)._broadcast_sigterm_tensor.__qualname__
    assert "_broadcast_sigterm_tensor" not in vars(loop)  # the class's method again
    assert preemption.preempted_at is None


def test_preemptions_flag_is_agreed_in_the_nan_guards_all_reduce_before_the_step(tmp_path):
    """With the NaN guard, Preemption's flag rides the guard's all-reduce before each optimizer
    step (one collective a step, not two): a signal that comes after step 2's agreement stops
    the run at the end of step 3. Alone, Preemption agrees at the step's end: step 2."""
    import signal

    from lightning_dist.callbacks.preemption import Preemption

    class SignalAtStep2(L.Callback):  # between step 2's agreement and Preemption's reading
        def __init__(self, preemption: Preemption) -> None:
            self.preemption = preemption

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 2:
                self.preemption.received = signal.SIGUSR1

    for guarded, stop in ((True, 3), (False, 2)):
        preemption = Preemption(tmp_path / str(guarded))
        guard = [NonFiniteGuard()] if guarded else []
        _fit(NaNAt(set()), [*guard, SignalAtStep2(preemption), preemption])
        assert preemption.preempted_at == stop, guarded
        assert preemption.checkpoint == tmp_path / str(guarded) / f"step{stop}.ckpt"
        assert preemption.checkpoint.is_file()


# --- checkpoints: the scan behind trainer.resume=auto ---------------------------------------


def test_auto_resume_skips_a_partial_checkpoint_and_says_so(tmp_path):
    complete = tmp_path / "step5.ckpt"
    complete.mkdir()
    for name in (".metadata", "meta.pt", "manifest.json"):
        (complete / name).write_bytes(b"")
    sharded = tmp_path / "step10.ckpt"
    sharded.mkdir()
    (sharded / "__0_0.distcp").write_bytes(b"a shard, no metadata yet")
    (sharded / ".metadata").write_bytes(b"")
    (sharded / "meta.pt").write_bytes(b"")  # the manifest, written last, is still missing
    (tmp_path / "step15.ckpt").write_bytes(b"a single file: not this format")
    point = latest_checkpoint(tmp_path)
    assert point.path == complete and point.step == 5
    assert point.skipped == [tmp_path / "step15.ckpt", sharded]
    assert point.describe().endswith("(step 5); skipped incomplete step15.ckpt, step10.ckpt")
    (sharded / "manifest.json").write_bytes(b"")
    assert latest_checkpoint(tmp_path).path == sharded


def test_only_a_child_of_the_launching_process_gives_its_exit_status_to_rank_zero(monkeypatch):
    """Under Lightning's own launcher a preempted or NaN-stopped child exits 0 (the launcher
    would kill rank 0 on its 75 or 3); rank 0 itself, torchrun's and srun's ranks keep the code."""
    import os

    from lightning_dist.strategies.launch import LAUNCHER_PID, rank_exit_code

    monkeypatch.setenv(LAUNCHER_PID, str(os.getppid()))  # this process is the launcher's child
    assert rank_exit_code(75) == 0 and rank_exit_code(3) == 0
    monkeypatch.setenv(LAUNCHER_PID, str(os.getpid()))  # this process launched the ranks
    assert rank_exit_code(75) == 75 and rank_exit_code(3) == 3
    monkeypatch.delenv(LAUNCHER_PID)  # torchrun, srun or a shell started this process
    assert rank_exit_code(75) == 75
    monkeypatch.setenv(LAUNCHER_PID, "not-a-pid")
    assert rank_exit_code(3) == 3


def test_the_watchdog_tells_a_lost_peer_from_other_errors():
    from lightning_dist.callbacks.heartbeat_store import lost_peer

    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1")
    try:
        try:
            raise gloo
        except RuntimeError as e:
            raise RuntimeError("stage 1 failed in forward") from e  # as the pipeline wraps it
    except RuntimeError as wrapped:
        assert lost_peer(wrapped)
    assert lost_peer(torch.distributed.DistNetworkError("socket closed"))
    assert not lost_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not lost_peer(torch.distributed.DistBackendError("NCCL error: invalid usage"))


def test_the_watchdog_knows_a_peer_process_has_ended_only_where_it_sees_its_pid():
    from lightning_dist.runtime.process_identity import PROCESS_ID, process_ended, start_time

    parent = os.getppid()  # a live process that is not this one
    beat = {"host": "h", "pid": parent, "process": {**PROCESS_ID, "start": start_time(parent)}}
    assert beat["process"]["start"] is not None and not process_ended(beat)
    # Its number now held by another process (another start time): the rank's process ended.
    assert process_ended({**beat, "process": {**beat["process"], "start": "1"}})
    # No process with the number at all (above any pid_max).
    assert process_ended({**beat, "pid": 2**31 - 1})
    # The same number in another container (its own pid namespace) tells nothing here.
    elsewhere = {**beat, "pid": 2**31 - 1, "process": {**beat["process"], "pid_namespace": "x"}}
    assert not process_ended(elsewhere)
    assert not process_ended({**beat, "pid": os.getpid()})  # never this process itself


def test_the_watchdog_knows_when_its_own_process_was_frozen():
    """A wait that overslept by more than half the stall limit: this process itself was stopped
    (a whole replica group under SIGSTOP), so the others' old heartbeats are not held against
    them, and the store's silence starts counting anew."""
    import time

    from lightning_dist.callbacks.watchdog import HangWatchdog

    watchdog = HangWatchdog(stall_seconds=10)
    watchdog._answered = watchdog._progress_time = time.monotonic() - 40
    assert not watchdog._was_frozen(4.0) and time.monotonic() - watchdog._answered > 39
    assert watchdog._was_frozen(40.0)  # a SIGSTOP of 40 s
    assert (
        time.monotonic() - watchdog._answered < 1 and time.monotonic() - watchdog._progress_time < 1
    )
