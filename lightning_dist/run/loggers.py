"""Experiment loggers: W&B online when logged in and the server answers, otherwise offline,
secrets never logged; and the CSV record of every metric that each run keeps in its run
directory."""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lightning_dist.runtime.redaction import REDACTED, redact, redact_text

__all__ = ["REDACTED", "metrics_logger", "offline_run_dir", "redact", "wandb_logger"]

WANDB_PROBE_SECONDS = 3.0
"""How long `wandb_logger` waits for the W&B server before logging offline instead."""


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


def wandb_unreachable(timeout: float = WANDB_PROBE_SECONDS) -> str | None:
    """Why the W&B server (`WANDB_BASE_URL`, default api.wandb.ai) cannot be reached within
    `timeout` seconds, or None when it answers. The name lookup runs in a thread, since a
    resolver with no network can block far longer than any socket timeout."""
    url = urlsplit(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))
    host = url.hostname or "api.wandb.ai"
    port = url.port or (80 if url.scheme == "http" else 443)
    where = f"{host}:{port}"
    found: list = []

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as e:
            found.append(e)

    thread = threading.Thread(target=lookup, daemon=True)
    thread.start()
    thread.join(timeout)
    if not found:
        return f"{where}: name lookup timed out"
    if isinstance(found[0], OSError):
        return f"{where}: {found[0].strerror or found[0]}"
    family, kind, proto, _, address = found[0][0]
    try:
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(timeout)
            sock.connect(address)
    except OSError as e:
        return f"{where}: {e.strerror or 'timed out'}"
    return None


def _default_mode(save_dir: str) -> str:
    """Online when logged in and the server answers (asked by the first process only, the one
    that logs); otherwise offline, with one warning line when a login goes unused."""
    from lightning_dist.run.checks import launch_rank_zero

    if not _wandb_logged_in():
        return "offline"
    if not launch_rank_zero():
        return "online"  # only the first process creates the W&B run
    reason = wandb_unreachable()
    if reason is None:
        return "online"
    print(
        f"warning: W&B server unreachable ({reason}); logging offline in {save_dir}/wandb. "
        f"Upload later with `wandb sync {save_dir}/wandb/offline-run-*`; set WANDB_MODE or "
        "logger.mode to choose",
        file=sys.stderr,
        flush=True,
    )
    return "offline"


def wandb_logger(
    *,
    project: str,
    save_dir: str,
    name: str | None = None,
    mode: str | None = None,
    tags: list[str] | None = None,
    id: str | None = None,
):
    """A Lightning WandbLogger; `mode=None` (and no `WANDB_MODE`) means online when logged in
    and the server answers within a few seconds, else offline.

    The run's id is kept in `<save_dir>/wandb_run_id`; `train()` passes it back as `id` when
    it resumes there (`trainer.resume=auto`), so the resumed run continues the same W&B run.
    """
    from lightning.pytorch.loggers import WandbLogger

    from lightning_dist._compat import drop_wandb_anonymous

    mode = mode or os.environ.get("WANDB_MODE") or _default_mode(save_dir)
    os.makedirs(save_dir, exist_ok=True)
    # W&B records the program arguments, and an override may carry a secret.
    sys.argv[1:] = [redact_text(arg) for arg in sys.argv[1:]]
    id = id or _new_run_id()
    if _first_process():
        Path(save_dir, WANDB_RUN_ID_FILE).write_text(id + "\n")
    logger = WandbLogger(project=project, name=name, save_dir=save_dir, mode=mode,
                         tags=tags or [], id=id, resume="allow")  # fmt: skip
    drop_wandb_anonymous(logger)  # else wandb warns about a setting nobody set
    return logger


WANDB_RUN_ID_FILE = "wandb_run_id"


def _new_run_id() -> str:
    """Eight lowercase hex characters, a valid W&B run id."""
    import secrets

    return secrets.token_hex(4)


def _first_process() -> bool:
    """Global rank 0 (Lightning's launcher leaves RANK unset there; torchrun sets it; under
    srun every task is a rank, and Lightning sets RANK only later, so SLURM_PROCID says it)."""
    return (
        os.environ.get("RANK", "0") == "0"
        and os.environ.get("SLURM_PROCID", "0") == "0"
        and os.environ.get("LOCAL_RANK", "0") == "0"
        and (os.environ.get("NODE_RANK", "0") == "0")
    )


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


def metrics_logger(run_dir: str, resume_step: int | None = None):
    """The CSV record of every logged metric, written by rank 0 to `<run_dir>/metrics/metrics.csv`
    whatever other logger runs: what `python -m lightning_dist.report` plots. A run that resumes
    from optimizer step N keeps the rows of steps 1..N and appends, so the file holds the whole
    run; any other run starts the file anew."""
    from lightning_dist.run.metrics_csv import MetricsCSVLogger

    return MetricsCSVLogger(Path(run_dir) / METRICS_CSV, resume_step)
