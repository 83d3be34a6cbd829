"""Experiment loggers: W&B online when logged in and the server answers, otherwise offline
with one line saying why (asked to log online, a run without a key or a server stops before it
starts), secrets never logged; and the CSV record of every metric that each run keeps in its run
directory."""

from __future__ import annotations

import os
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lightning_dist.runtime.redaction import REDACTED, redact, redact_text

__all__ = [
    "REDACTED", "check_logger", "check_wandb_mode", "metrics_logger", "offline_run_dir", "redact",
    "wandb_logger", "wandb_server",
]  # fmt: skip

WANDB_PROBE_SECONDS = 3.0
"""How long the W&B server may take to answer before the run logs offline (default mode) or
stops (asked to log online)."""
WANDB_MODES = ("online", "offline", "disabled", "shared", "run", "dryrun")
"""wandb's own modes (`run` and `dryrun` are its old names for online and offline)."""
WANDB_LOCAL_MODES = ("offline", "dryrun", "disabled")
"""The modes that never talk to the W&B server."""


@dataclass(frozen=True)
class WandbServer:
    """The W&B server wandb would log to, and where it would find an API key for it."""

    url: str
    key_source: str | None
    """`WANDB_API_KEY`, `wandb's settings`, `WANDB_IDENTITY_TOKEN_FILE` or `netrc`; None: no
    key anywhere (wandb.init would fail with `UsageError: No API key configured`)."""


def wandb_server() -> WandbServer:
    """Read wandb's own settings the way `wandb.init` does: its settings file (where `wandb
    login --host` saves the host), then the `WANDB_*` environment, over wandb's default server
    (https://api.forge.coreweave.com in wandb 0.31; https://api.wandb.ai before). A fresh
    `wandb.Settings`, not wandb's process-wide one: that keeps the environment of its first use.

    Raises ValueError when wandb refuses a setting (`WANDB_BASE_URL=https://wandb.ai`)."""
    import wandb

    from lightning_dist._compat import wandb_netrc_has_key

    settings = wandb.Settings(silent=True)  # else reading its settings file prints a line
    url = os.environ.get("WANDB_BASE_URL") or settings.base_url  # what wandb < 0.19 reads
    if hasattr(settings, "update_from_env_vars"):
        config_dir = os.environ.get("WANDB_CONFIG_DIR") or os.path.join("~", ".config", "wandb")
        settings.settings_system = os.path.join(os.path.expanduser(config_dir), "settings")
        try:
            settings.update_from_system_settings()
            settings.update_from_env_vars(dict(os.environ))
        except ValueError as e:  # pydantic's ValidationError, many lines: its first error
            errors = e.errors() if hasattr(e, "errors") else []
            why = f"{errors[0]['loc'][0]}: {errors[0]['msg']}" if errors else str(e)
            raise ValueError(
                f"wandb refuses its settings ({why}); fix the WANDB_* "
                "environment variable or wandb's settings file"
            ) from None
        url = settings.base_url
    if os.environ.get("WANDB_API_KEY"):
        source = "WANDB_API_KEY"
    elif getattr(settings, "api_key", None):
        source = "wandb's settings"
    elif os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        source = "WANDB_IDENTITY_TOKEN_FILE"
    else:
        source = "netrc" if wandb_netrc_has_key(url) else None
    return WandbServer(url=url, key_source=source)


def wandb_unreachable(url: str, timeout: float = WANDB_PROBE_SECONDS) -> str | None:
    """Why the W&B server at `url` cannot be reached within `timeout` seconds, or None when it
    answers. The name lookup runs in a thread, since a resolver with no network can block far
    longer than any socket timeout."""
    parts = urlsplit(url)
    host = parts.hostname or url
    port = parts.port or (80 if parts.scheme == "http" else 443)
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


def wandb_mode_asked(mode: str | None) -> tuple[str | None, str]:
    """The W&B mode the run was asked for, and by what: `logger.mode`, else `WANDB_MODE`;
    (None, "") when neither is set (the default mode). Raises ValueError for a mode wandb does
    not have."""
    asked, where = (mode, "logger.mode") if mode else (os.environ.get("WANDB_MODE"), "WANDB_MODE")
    if not asked:
        return None, ""
    if asked not in WANDB_MODES:
        raise ValueError(
            f"{where}={asked} is not a W&B mode: use online, offline or disabled, or leave "
            "logger.mode null and WANDB_MODE unset (online when logged in and the server "
            "answers, else offline)"
        )
    return asked, where


def check_logger(logger: Any) -> None:
    """The experiment logger's config (a `_target_` node, or None) can log where it was asked
    to: W&B (ours or Lightning's WandbLogger) by `check_wandb_mode`."""
    target = str(logger.get("_target_", "")) if logger is not None else ""
    if target.rsplit(".", 1)[-1] in ("wandb_logger", "WandbLogger"):
        check_wandb_mode(logger.get("mode"))


def check_wandb_mode(mode: str | None) -> None:
    """Before any rank starts: a run asked to log online (`logger.mode=online` or
    `WANDB_MODE=online`) has an API key (every rank checks) and a server that answers (the
    first process, the one that logs, asks it); else one ValueError naming the problem and the
    fix. The default mode needs neither: `wandb_logger` logs offline then, with one line."""
    from lightning_dist.runtime.console import launch_rank_zero

    asked, where = wandb_mode_asked(mode)
    if asked is None or asked in WANDB_LOCAL_MODES:
        return
    server = wandb_server()
    offline = "or log offline with logger.mode=offline and upload later with `wandb sync`"
    if server.key_source is None:
        raise ValueError(
            f"{where}={asked}, but W&B has no API key for {server.url}: run `wandb login` (or "
            f"set WANDB_API_KEY), {offline}"
        )
    reason = wandb_unreachable(server.url) if launch_rank_zero() else None
    if reason is not None:
        raise ValueError(
            f"{where}={asked}, but the W&B server does not answer ({reason}): check the "
            f"network and WANDB_BASE_URL, {offline}"
        )


def _default_mode(save_dir: str) -> str:
    """Online when logged in and the server answers (asked by the first process only, the one
    that logs); otherwise offline, with one warning line that says why."""
    from lightning_dist.runtime.console import launch_rank_zero

    if not launch_rank_zero():
        return "online"  # only the first process creates the W&B run
    server = wandb_server()
    if server.key_source is None:
        why = f"W&B has no API key for {server.url} (`wandb login` saves one)"
    else:
        unreachable = wandb_unreachable(server.url)
        if unreachable is None:
            return "online"
        why = f"W&B server unreachable ({unreachable})"
    print(
        f"warning: {why}; logging offline in {save_dir}/wandb (upload later with "
        f"`wandb sync {save_dir}/wandb/offline-run-*`); set logger.mode (or WANDB_MODE) to "
        "online or offline to choose",
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
    entity: str | None = None,
    group: str | None = None,
    tags: list[str] | None = None,
    notes: str | None = None,
    job_type: str | None = None,
    id: str | None = None,
):
    """A Lightning WandbLogger (conf/logger/wandb.yaml; each argument is `logger.<name>=...`).

    Args:
        project: the W&B project (the config's top-level `project`).
        save_dir: where the offline run and `wandb_run_id` go (the run directory).
        name: the run's display name (`run_name`); null lets W&B choose.
        mode: online, offline or disabled. Null (and no `WANDB_MODE`): online when logged in
            and the server answers within `WANDB_PROBE_SECONDS`, else offline with one warning
            line. Asked for online (here or by `WANDB_MODE`) without a key or a server, the run
            stops before it starts (`check_wandb_mode`).
        entity: the W&B user or team that owns the run; null: your default entity.
        group: groups runs in the W&B UI (e.g. the jobs of one sweep).
        tags: a list of tags, e.g. `logger.tags=[fsdp,baseline]`.
        notes: a longer description of the run.
        job_type: the kind of run (train, eval, ...), to filter and group by in W&B.
        id: the W&B run id. Null: a new one, kept in `<save_dir>/wandb_run_id`; `train()` passes
            it back here when it resumes there (`trainer.resume=auto`), so the resumed run
            continues the same W&B run.
    """
    from lightning.pytorch.loggers import WandbLogger

    from lightning_dist._compat import drop_wandb_anonymous

    mode = wandb_mode_asked(mode)[0] or _default_mode(save_dir)
    os.makedirs(save_dir, exist_ok=True)
    # W&B records the program arguments, and an override may carry a secret.
    sys.argv[1:] = [redact_text(arg) for arg in sys.argv[1:]]
    id = id or _new_run_id()
    if _first_process():
        Path(save_dir, WANDB_RUN_ID_FILE).write_text(id + "\n")
    logger = WandbLogger(
        project=project,
        name=name,
        save_dir=save_dir,
        mode=mode,
        entity=entity,
        group=group,
        tags=list(tags or []),
        notes=notes,
        job_type=job_type,
        id=id,
        resume="allow",
    )
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
