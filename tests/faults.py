"""Faults to inject into a real training run (tests only): `+callbacks.kill._target_=...`.

Loaded by tests/toy_train.py, which allows `tests.faults.` as a callback and data target."""

import json
import os
import signal
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from lightning_dist.lm.data import SyntheticDataModule


class KillAtStep(Callback):
    """SIGKILL rank `rank` after optimizer step `step`, on the first attempt only (torchrun
    counts its restarts in TORCHELASTIC_RESTART_COUNT)."""

    def __init__(self, step: int, rank: int = 1) -> None:
        self.step, self.rank = step, rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if first_attempt and trainer.global_rank == self.rank and trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class StopAtStep(Callback):
    """Rank `rank`, once it has finished optimizer step `step`, waits `seconds` as the next
    batch starts (a slow data read: its heartbeat says where it is) and then SIGSTOPs itself:
    the hang watchdog must name step `step` + 1, phase data (tests/cluster/test_stopped_rank.py)."""

    def __init__(self, step: int, rank: int = 0, seconds: float = 1.0) -> None:
        self.step, self.rank, self.seconds = step, rank, seconds

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            time.sleep(self.seconds)
            os.kill(os.getpid(), signal.SIGSTOP)


class KillEvery(Callback):
    """SIGKILL rank `rank` after optimizer step (attempt + 1) x `every` on the first `times`
    torchrun attempts: failures `every` steps apart in training progress (bench/goodput.py)."""

    def __init__(self, every: int, times: int, rank: int = 1) -> None:
        self.every, self.times, self.rank = every, times, rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        due = attempt < self.times and trainer.global_step == (attempt + 1) * self.every
        if trainer.global_rank == self.rank and due:
            os.kill(os.getpid(), signal.SIGKILL)


class KillNodeAtStep(Callback):
    """SIGKILL torchrun's node `node`, its agent and its ranks (a lost node), after optimizer
    step `step`, once per run folder (marker files `node_killed.rank<N>`): each of its ranks kills
    the agent, its parent, and then itself (torchrun starts each rank in a session of its own)."""

    def __init__(self, step: int, node: int = 1) -> None:
        self.step, self.node = step, node

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        marker = Path(trainer.default_root_dir) / f"node_killed.rank{trainer.global_rank}"
        this_node = os.environ.get("GROUP_RANK") == str(self.node)
        if this_node and trainer.global_step == self.step and not marker.exists():
            marker.touch()
            try:
                os.kill(os.getppid(), signal.SIGKILL)
            except ProcessLookupError:  # the node's other rank was first
                pass
            os.kill(os.getpid(), signal.SIGKILL)


class SlowBelowWorld(Callback):
    """Sleep `seconds` after each optimizer step while the world has fewer than `world_size`
    ranks: a shrunk elastic job runs long enough for a node to join it."""

    def __init__(self, world_size: int, seconds: float) -> None:
        self.world_size, self.seconds = world_size, seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.world_size < self.world_size:
            time.sleep(self.seconds)


class RecordSamples(Callback):
    """Append the training-set indices of every micro-batch this rank reads to
    `<run dir>/samples/<pid>.jsonl`, with the optimizer step it belongs to, the world size and
    the time: which samples each world's global batches really held."""

    def setup(self, trainer, pl_module, stage) -> None:
        rows = trainer.datamodule.train_set
        self.index = {tuple(rows[i].tolist()): i for i in range(len(rows))}
        folder = Path(trainer.default_root_dir) / "samples"
        folder.mkdir(exist_ok=True)
        self.path = folder / f"{os.getpid()}.jsonl"

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        ids = [self.index[tuple(row.tolist())] for row in batch]
        record = {
            "step": trainer.global_step + 1,
            "world_size": trainer.world_size,
            "time": time.time(),
            "ids": ids,
        }
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


class ClaimFolderAtStep(Callback):
    """After optimizer step `step`, rank 0 claims the checkpoint folder as a newer world would
    (checkpoint/fence.py): the one that started as a split-off copy of this job."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        from lightning_dist.checkpoint.fence import FolderFence

        if trainer.is_global_zero and trainer.global_step == self.step:
            folder = Path(trainer.default_root_dir) / "checkpoints"
            FolderFence(folder).claim({"world_size": 8, "num_nodes": 2})


class KillInReplicaGroup(Callback):
    """SIGKILL rank `rank` of replica group `group` (strategy=ft_hsdp) on the group's first
    attempt only: in step `step` between its forward and its backward (after the step's quorum,
    so the others see the group fail mid-step), or after it with `after_step=true`."""

    def __init__(self, step: int, group: int = 1, rank: int = 1, after_step: bool = False) -> None:
        self.step, self.group, self.rank, self.after_step = step, group, rank, after_step

    def _kill_at(self, trainer, step: int) -> None:
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        mine = os.environ.get("REPLICA_GROUP_ID") == str(self.group)
        if first_attempt and mine and trainer.global_rank == self.rank and step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if not self.after_step:
            self._kill_at(trainer, trainer.global_step + 1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.after_step:
            self._kill_at(trainer, trainer.global_step)


class ParameterDigest(Callback):
    """At the end of training, each rank writes the SHA-256 of its parameter shards, bit for
    bit, to <run dir>/params_rank<r>.sha256."""

    def on_train_end(self, trainer, pl_module) -> None:
        import hashlib

        from lightning_dist.parallel.gradient_reduction import local_tensor

        digest = hashlib.sha256()
        for name, param in sorted(pl_module.named_parameters()):
            digest.update(name.encode())
            digest.update(local_tensor(param).detach().cpu().contiguous().numpy().tobytes())
        out = Path(trainer.default_root_dir) / f"params_rank{trainer.global_rank}.sha256"
        out.write_text(digest.hexdigest() + "\n")


class FirstHalfAtSteps(SyntheticDataModule):
    """Synthetic data whose global batch, at the optimizer steps (0-based) listed in the
    environment variable FIRST_HALF_AT_STEPS, keeps only its first half: one process's
    reference for a job of two replica groups in which the second was out for those steps."""

    def on_after_batch_transfer(self, batch, dataloader_idx):
        steps = {int(s) for s in os.environ.get("FIRST_HALF_AT_STEPS", "").split(",") if s}
        trainer = self.trainer
        if trainer is not None and trainer.training and trainer.global_step in steps:
            return batch[: len(batch) // 2]
        return batch
