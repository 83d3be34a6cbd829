"""A quiet console: third-party hints that users cannot act on are silenced, the rest shown once.

Each rank process calls `quiet_third_party()` before its Trainer is built (the progress callback
does, see `callbacks/progress.py`); it is idempotent. What it silences, and why:

- kineto's `USDT: ... profiler_start/stop` lines, two per profiled step and rank: the
  profiler's log level is raised (`KINETO_LOG_LEVEL=6`, only when unset: kineto then hides its
  errors too; `KINETO_LOG_LEVEL=4` brings both back);
- Lightning's "💡 Tip ... litlogger" advert, on every Trainer;
- torch's `broadcast_buffers` deprecation, raised by the DDP wrapper on every rank for an
  argument Lightning's DDPStrategy passes through (`strategy.broadcast_buffers`);
- torch's pytree notice that torchao's enums are "now natively supported" (two lines whenever
  transformers imports torchao, e.g. to build a Mixtral or Qwen2-MoE model);
- Lightning's hint that `srun` exists but is unused, printed by every rank of a local run on any
  machine with Slurm installed: local runs there are deliberate, and a run that needs Slurm
  (`hardware.num_nodes` above 1) already stops with its own error (docs/LAUNCH.md);
- torch's notice that registering an Enum as a pytree constant is deprecated, logged on every
  rank for each of torchao's enums (`KernelPreference`, `ScaleCalculationMode`) when transformers
  loads torchao: a Hugging Face model, or context parallelism's look for one, imports it. The
  call is torchao's; other packages' enums still show it;
- torch's "The given buffer is not writable" (a `torch.frombuffer` of torchft's received
  bytes), two lines on every rank of a replica group that heals from a peer (`strategy=ft_hsdp`):
  the tensors are copied into the group's own at once (`cluster/replica_groups.py`).

W&B's "anonymous setting has no effect" is avoided at its source (`loggers.wandb_logger`).

And before torch loads (`quiet_native_logs`, first thing in `lightning_dist.train.main`): torch's
C++ warnings, above all c10d's `TCPStore ... recvValueWithTimeout failed` with a 20-frame C++
stack, printed by a surviving rank whose store call meets rank 0's ended process (the hang
watchdog names rank 0 in its own line). c10 reads `TORCH_CPP_LOG_LEVEL` once, as torch loads,
and ranks inherit it from the process that starts them; errors still print, and a user's own
`TORCH_CPP_LOG_LEVEL` (`WARNING`, `INFO`) is kept.
"""

from __future__ import annotations

import logging
import os
import warnings

KINETO_QUIET_LEVEL = "6"
"""Above kineto's USDT level (5): its profiler_start/stop lines are not printed."""

_SILENCED_LOGS = ("💡 Tip: For seamless cloud logging",)
"""Starts of INFO lines of `lightning.pytorch.utilities.rank_zero` that never print."""


class _DropHints(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_SILENCED_LOGS)


_FILTER = _DropHints()

_PYTREE_LOG = "torch.utils._pytree"
_ENUM_CONSTANT_NOTICE = "is an Enum subclass and is now natively supported"


class _DropTorchaoEnumNotices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if _ENUM_CONSTANT_NOTICE not in str(record.msg):
            return True
        enum_class = record.args[0] if isinstance(record.args, tuple) and record.args else None
        return not getattr(enum_class, "__module__", "").startswith("torchao.")


_PYTREE_FILTER = _DropTorchaoEnumNotices()


CPP_LOG_LEVEL = "ERROR"
"""torch's C++ log level for our processes (`quiet_native_logs`): warnings hidden, errors shown."""


def quiet_native_logs() -> None:
    """Hide torch's C++ warnings (see the module docstring) in this process, when torch has not
    loaded yet, and in every process it starts; a level the user set is kept."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", CPP_LOG_LEVEL)


def quiet_profiler() -> None:
    """Hide kineto's USDT lines; call before the first `torch.profiler.profile` starts."""
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET_LEVEL)


def quiet_third_party() -> None:
    """Install the filters of the module docstring (idempotent)."""
    quiet_profiler()
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        log = logging.getLogger(name)
        if _FILTER not in log.filters:
            log.addFilter(_FILTER)
    pytree_log = logging.getLogger(_PYTREE_LOG)
    if _PYTREE_FILTER not in pytree_log.filters:
        pytree_log.addFilter(_PYTREE_FILTER)
    warnings.filterwarnings(
        "ignore", message=r"`broadcast_buffers` is deprecated", category=FutureWarning
    )
    warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system")
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r"The given buffer is not writable")


def quiet_known_warnings() -> None:
    """Silence deprecation notices raised inside Lightning itself, which users cannot act on."""
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    warnings.filterwarnings("ignore", message=r".*all_gather is deprecated.*")
    # Lightning asks for a resumable dataloader mid-epoch, but resume is exact without one: the
    # sampler restarts from the datamodule's saved step (the resume tests compare bit for bit).
    warnings.filterwarnings("ignore", message=r".*your dataloader is not resumable.*")
    # A resumed run saves into its own checkpoint folder, which holds its earlier saves.
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    quiet_third_party()  # profiler USDT lines and repeated third-party tips, with or without callbacks
