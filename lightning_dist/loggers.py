"""Experiment loggers: W&B online when logged in, otherwise offline, secrets never logged; and
the CSV record of every metric that each run keeps in its run directory."""

from __future__ import annotations

import os
import re
from typing import Any

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

    from lightning_dist._compat import wandb_run_started

    if not isinstance(logger, WandbLogger) or not wandb_run_started(logger):
        return None
    run = logger.experiment
    if getattr(run.settings, "mode", None) != "offline" and not run.offline:
        return None
    return os.path.dirname(run.dir.rstrip("/"))


METRICS_CSV = "metrics/metrics.csv"
"""Where `metrics_logger` writes, relative to the run directory (`lightning_dist.report` reads it)."""


def metrics_logger(run_dir: str):
    """Lightning's CSVLogger writing every logged metric, from rank 0, to `<run_dir>/metrics/`,
    whatever other logger runs: the record that `python -m lightning_dist.report` plots.

    Not the run directory itself: CSVLogger warns about (and clears) a non-empty folder, and the
    run directory already holds Hydra's files.
    """
    from lightning.pytorch.loggers import CSVLogger

    return CSVLogger(save_dir=run_dir, name="", version=os.path.dirname(METRICS_CSV))
