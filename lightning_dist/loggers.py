"""Experiment loggers: W&B online when logged in, otherwise offline; secrets never logged."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only

SECRET_KEY = re.compile(r"(api[_-]?key|token|secret|password|passwd|credential)", re.IGNORECASE)
REDACTED = "<redacted>"


def redact(value: Any) -> Any:
    """A copy of a nested dict/list with the values of secret-looking keys replaced."""
    if isinstance(value, dict):
        return {k: (REDACTED if SECRET_KEY.search(str(k)) else redact(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


def _wandb_logged_in() -> bool:
    """True when an API key is in the environment or in the netrc that `wandb login` writes."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc

    path = os.environ.get("NETRC", os.path.expanduser("~/.netrc"))
    try:
        hosts = netrc.netrc(path).hosts
    except (OSError, netrc.NetrcParseError):
        return False
    base = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("//")[-1].rstrip("/")
    return base in hosts


def wandb_logger(
    *,
    project: str,
    save_dir: str,
    name: str | None = None,
    mode: str | None = None,
    tags: list[str] | None = None,
):
    """A Lightning WandbLogger; `mode=None` means online if logged in, else offline."""
    from lightning.pytorch.loggers import WandbLogger

    mode = mode or os.environ.get("WANDB_MODE") or ("online" if _wandb_logged_in() else "offline")
    os.makedirs(save_dir, exist_ok=True)
    return WandbLogger(project=project, name=name, save_dir=save_dir, mode=mode, tags=tags or [])


def offline_run_dir(logger: Any) -> str | None:
    """Where an offline W&B run was written (the folder `wandb sync` takes), else None."""
    from lightning.pytorch.loggers import WandbLogger

    if not isinstance(logger, WandbLogger) or logger._experiment is None:
        return None
    run = logger.experiment
    if getattr(run.settings, "mode", None) != "offline" and not run.offline:
        return None
    return os.path.dirname(run.dir.rstrip("/"))


class JsonlMetrics(Logger):
    """Appends every logged metric to `<run_dir>/metrics.jsonl` from rank 0, whatever other
    logger runs: the record that `python -m lightning_dist.report` plots."""

    def __init__(self, run_dir: str) -> None:
        super().__init__()
        self.path = os.path.join(run_dir, "metrics.jsonl")

    @property
    def name(self) -> str:
        return "metrics"

    @property
    def version(self) -> str:
        return "0"

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """The config is in .hydra/config.yaml already; nothing to add here."""

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
