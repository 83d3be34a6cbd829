"""The run directory holds no secret and is the owner's alone: a Hydra callback.

Hydra writes `.hydra/config.yaml`, `hydra.yaml` and `overrides.yaml` before any of our code
runs, with every override verbatim and the umask's modes (0644). conf/train.yaml therefore sets
`hydra.output_subdir: null` (Hydra writes nothing) and registers `ProtectRunDir`, which:

- at the start of a run or multirun, before Hydra creates any folder, sets the umask to 077
  (`paths.private=true`, the default), so run directories, logs, checkpoints and W&B files are
  created 0700/0600, in this process and in the ranks it starts;
- at the start of each job writes the three files itself, redacted (`lightning_dist.runtime.redaction`),
  on the first rank only; so a secret never reaches the disk, not even for a moment;
- redacts what Hydra did write: the files of a user-set `hydra.output_subdir`, and a multirun's
  `multirun.yaml`;
- redacts the program arguments (`sys.argv`), which W&B records.

Lightning's launcher starts ranks 1..N-1 with this job's real overrides (they need the values),
so those processes still see them in their arguments, as any local process list shows.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lightning_dist.runtime.redaction import override_secrets, redact, redact_text, remember_secrets

try:
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover - Hydra is a dependency; keeps the module importable
    _HydraCallback = object

PRIVATE_UMASK = 0o077


def _save(data: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(data), path)


def write_job_files(config: DictConfig, folder: Path) -> None:
    """What Hydra's `.hydra/` holds (config.yaml, hydra.yaml, overrides.yaml), redacted."""
    everything = OmegaConf.to_container(config, resolve=False, enum_to_str=True)
    hydra = everything.pop("hydra")
    _save(redact(everything), folder / "config.yaml")
    _save(redact({"hydra": hydra}), folder / "hydra.yaml")
    _save([redact_text(str(o)) for o in config.hydra.overrides.task], folder / "overrides.yaml")


def redact_yaml_file(path: Path) -> None:
    """Rewrite a YAML file that Hydra wrote, with its secrets redacted (when it has any)."""
    if not path.is_file():
        return
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    clean = redact(data)
    if clean != data:
        _save(clean, path)


def _chmod(path: Path, mode: int) -> None:
    try:
        path.chmod(mode)
    except OSError:
        pass  # not ours to change (a shared parent); the umask covers what we create


class ProtectRunDir(_HydraCallback):
    """Hydra callback (conf/train.yaml `hydra.callbacks.protect_run_dir`): see the module doc.

    `subdir` is where the job's config files go in the run directory (null: nowhere).
    """

    def __init__(self, subdir: str | None = ".hydra") -> None:
        self.subdir = subdir
        self._umask: int | None = None

    @staticmethod
    def _private(config: DictConfig) -> bool:
        return bool(OmegaConf.select(config, "paths.private", default=True))

    def _restrict(self, config: DictConfig) -> None:
        if self._private(config) and self._umask is None:
            self._umask = os.umask(PRIVATE_UMASK)

    def _restore(self) -> None:
        if self._umask is not None:
            os.umask(self._umask)
            self._umask = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._restrict(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._restrict(config)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.types import RunMode

        from lightning_dist.runtime.console import launch_rank_zero

        overrides = config.hydra.overrides
        remember_secrets(override_secrets([*overrides.task, *overrides.hydra]))
        sys.argv[1:] = [redact_text(arg) for arg in sys.argv[1:]]
        self._restrict(config)
        run_dir = Path(config.hydra.runtime.output_dir)
        written = config.hydra.output_subdir
        if written is not None:  # the user asked Hydra to write them: redact what it wrote
            for path in (run_dir / written).glob("*.yaml"):
                redact_yaml_file(path)
        elif self.subdir and launch_rank_zero():
            write_job_files(config, run_dir / self.subdir)
        if config.hydra.mode == RunMode.MULTIRUN:
            redact_yaml_file(Path(config.hydra.sweep.dir) / "multirun.yaml")
        if self._private(config):
            # Made under the umask already, unless they existed before this run (a resume).
            written_dir = run_dir / (written or self.subdir or "")
            for folder in dict.fromkeys([run_dir, written_dir]):
                if folder.is_dir():
                    _chmod(folder, 0o700)
                    for path in folder.iterdir():
                        if path.is_file() and not path.is_symlink():
                            _chmod(path, 0o600)

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._restore()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._restore()
