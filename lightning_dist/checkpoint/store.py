"""A run's checkpoints, one owner (`RunCheckpoints`): finding the one to resume from, verifying
it, the callbacks that save and load; and writing single-file checkpoints atomically.

A run's checkpoints are `step<N>.ckpt` folders in its checkpoint folder, one format for every
strategy (docs/CHECKPOINTS.md). A folder counts only when complete: its `manifest.json` is
written last, after every shard, DCP's `.metadata` and Lightning's `meta.pt`. A single file
(Lightning's own format, written by a strategy outside lightning_dist through
`AtomicCheckpointIO`, under a temporary name then renamed) is not picked by `trainer.resume=auto`:
lightning_dist strategies cannot load it. Nor is a weights-only folder (written by
`python -m lightning_dist.checkpoint import`: a manifest but no `meta.pt`): it starts a run
through `trainer.init_from`, it does not continue one.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lightning_dist._compat import LIGHTNING_CHECKPOINT_METADATA
from lightning_dist.checkpoint.fence import CheckpointFence, FolderFence
from lightning_dist.checkpoint.format import (
    check_model_shapes,
    is_weights_only,
    require_lightning_state,
    require_resumable,
)
from lightning_dist.checkpoint.manifest import MANIFEST, PERMISSION_FIX, cannot_read, open_manifest
from lightning_dist.options.knobs import options_of
from lightning_dist.options.saving import SaveOptions

STEP_NAME = re.compile(r"^step(\d+)\.ckpt$")
DCP_METADATA = ".metadata"


@dataclass
class ResumePoint:
    """The latest complete checkpoint of a folder and the incomplete ones passed over."""

    path: Path | None = None
    step: int = 0
    skipped: list[Path] = field(default_factory=list)
    weights_only: list[Path] = field(default_factory=list)
    superseded: list[Path] = field(default_factory=list)
    """Complete, but saved by a world that another had replaced (checkpoint/fence.py)."""

    def describe(self) -> str:
        """One line for the console."""
        skipped = ""
        if self.skipped:
            names = ", ".join(p.name for p in self.skipped)
            skipped = f"; skipped incomplete {names}"
        if self.weights_only:
            first = self.weights_only[0]
            skipped += (
                f"; skipped {first.name}, which holds weights only; start from it with "
                f"trainer.init_from={first}"
            )
        if self.superseded:
            names = ", ".join(p.name for p in self.superseded)
            skipped += f"; skipped {names}, saved by a world that had been replaced"
        if self.path is None:
            return f"trainer.resume=auto: no complete checkpoint yet, starting at step 0{skipped}"
        return f"trainer.resume=auto: resuming from {self.path} (step {self.step}){skipped}"


def is_complete(path: Path) -> bool:
    """A finished, resumable checkpoint: a folder with its manifest (written last) and its
    metadata files. A weights-only folder (no `meta.pt`) is not one (`format.is_weights_only`)."""
    return path.is_dir() and all(
        (path / name).is_file() for name in (MANIFEST, DCP_METADATA, LIGHTNING_CHECKPOINT_METADATA)
    )


def step_folders(dirpath: str | Path) -> list[tuple[int, Path]]:
    """Every `step<N>.ckpt` in `dirpath` as (N, path), by N, complete or not (none if the
    folder is missing)."""
    folder = Path(dirpath)
    if not folder.is_dir():
        return []
    matches = ((STEP_NAME.match(entry.name), entry) for entry in folder.iterdir())
    return sorted((int(m.group(1)), entry) for m, entry in matches if m)


def latest_checkpoint(dirpath: str | Path) -> ResumePoint:
    """The complete `step<N>.ckpt` with the largest N in `dirpath` (missing folder: none)."""
    found = ResumePoint()
    candidates = step_folders(dirpath)
    if not candidates:
        return found
    replaced_after = FolderFence(Path(dirpath)).replaced_after()
    for step, entry in reversed(candidates):  # only those down to the resume point
        if not is_complete(entry):
            (found.weights_only if is_weights_only(entry) else found.skipped).append(entry)
        elif step > replaced_after.get(_writer(entry), float("inf")):
            found.superseded.append(entry)
        else:
            found.path, found.step = entry, step
            break
    return found


def _writer(path: Path) -> int | None:
    """The number of the world that wrote a complete checkpoint (None: unfenced or unreadable)."""
    try:
        return json.loads((path / MANIFEST).read_text()).get("writer")
    except (OSError, ValueError):
        return None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch.save checkpoint IO, writing to `<name>.tmp` and renaming: a save that
    is interrupted leaves no file that looks complete."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        path = Path(path)
        temporary = path.with_name(path.name + ".tmp")
        super().save_checkpoint(checkpoint, temporary, storage_options)
        os.replace(temporary, path)


MODEL_PREFIX = "model."
"""CausalLM holds the model as `self.model`: its state-dict names start with this."""


@dataclass(frozen=True, kw_only=True)
class RunCheckpoints:
    """A run's checkpoints, one owner: where they go, which one the run resumes or starts from
    (verified before any process starts), the callback that saves them, and the one that loads
    `trainer.init_from`'s weights. Resuming itself is Lightning's `trainer.fit(ckpt_path=...)`,
    which reaches the strategy's `load_checkpoint` (strategies/checkpoint_hooks.py, through
    `checkpoint.format.load_state`)."""

    dirpath: Path
    """`saving.dirpath`, or `<run dir>/checkpoints`."""
    saving: SaveOptions = field(default_factory=SaveOptions)
    resume: str | None = None
    ckpt_path: str | None = None
    init_from: str | None = None

    @classmethod
    def of(cls, trainer: Any, run_dir: Path) -> RunCheckpoints:
        """From `trainer` (the `TrainerSchema`) and the run directory: checkpoints go to
        `trainer.checkpoint.dirpath`, or `<run dir>/checkpoints`."""
        c = trainer.checkpoint
        return cls(
            dirpath=Path(c.dirpath or Path(run_dir) / "checkpoints"),
            saving=options_of(SaveOptions, c),
            resume=trainer.resume,
            ckpt_path=trainer.ckpt_path,
            init_from=trainer.init_from,
        )

    def start_point(self) -> tuple[str | None, str | None]:
        """The checkpoint to resume from (None: a fresh start) and, for trainer.resume=auto, one
        line saying what was found; ValueError for settings that contradict each other."""
        if self.resume not in (None, "auto"):
            raise ValueError(f"trainer.resume={self.resume!r} must be auto or null")
        if self.saving.keep_last is not None and (
            isinstance(self.saving.keep_last, bool) or self.saving.keep_last < 1
        ):
            raise ValueError(
                f"trainer.checkpoint.keep_last={self.saving.keep_last!r} must be 1 or more (null keeps "
                "every checkpoint)"
            )
        if self.resume == "auto":
            if self.ckpt_path:
                raise ValueError(
                    "trainer.resume=auto and trainer.ckpt_path are both set; keep one of them"
                )
            try:
                point = latest_checkpoint(self.dirpath)
            except OSError as e:
                raise ValueError(
                    f"trainer.resume=auto cannot read the checkpoint folder {self.dirpath} "
                    f"({e.strerror}); {PERMISSION_FIX}"
                ) from e
            return (str(point.path) if point.path else None), point.describe()
        if self.init_from and self.ckpt_path:
            raise ValueError(
                "trainer.init_from and trainer.ckpt_path are both set; init_from starts from "
                "weights, ckpt_path resumes a run: keep one of them"
            )
        try:
            missing = self.ckpt_path and not Path(self.ckpt_path).exists()
        except PermissionError as e:  # a folder on the way this user may not enter
            raise ValueError(
                f"trainer.ckpt_path={self.ckpt_path} cannot be reached: this user may not enter "
                f"{e.filename}; {PERMISSION_FIX}"
            ) from e
        if missing:
            raise FileNotFoundError(f"trainer.ckpt_path={self.ckpt_path} does not exist")
        return self.ckpt_path, None

    def check_folder(self, checkpoint_bytes: int, num_nodes: int = 1) -> None:
        """Before launch, on every rank: a save can land in the checkpoint folder (every run
        may save one: preemption does), so its path is a folder or can become one and this user
        may write there; ValueError naming the path and the fix otherwise. Room for one
        checkpoint of `checkpoint_bytes` is an error when saves are scheduled on one node, a
        warning otherwise (no save may come; on many nodes a node-local disk takes a share)."""
        import shutil

        setting = f"the checkpoint folder {self.dirpath} (trainer.checkpoint.dirpath)"
        existing = self.dirpath.absolute()
        try:
            while not existing.exists() and existing != existing.parent:
                existing = existing.parent
        except PermissionError as e:  # a parent this user may not enter
            raise ValueError(
                f"{setting} cannot be reached: this user may not enter {e.filename}; fix the "
                "permissions, or set trainer.checkpoint.dirpath to a folder this user owns"
            ) from e
        if not existing.is_dir():
            where = (
                "is a file"
                if existing == self.dirpath.absolute()
                else f"is below a file, {existing}"
            )
            raise ValueError(f"{setting} {where}; set trainer.checkpoint.dirpath to a folder")
        if not os.access(existing, os.W_OK | os.X_OK):
            what = "it" if existing == self.dirpath.absolute() else f"its parent {existing}"
            raise ValueError(
                f"{setting} cannot be written: this user may not write to {what}; fix the "
                "permissions, or set trainer.checkpoint.dirpath to a folder this user owns"
            )
        free = shutil.disk_usage(existing).free
        if free < checkpoint_bytes:
            from lightning_dist.checkpoint.describe import human_bytes
            from lightning_dist.runtime.console import warn_once

            message = (
                f"{setting} is on a filesystem with {human_bytes(free)} free, but one checkpoint "
                f"of this model takes {human_bytes(checkpoint_bytes)} (parameters and optimizer "
                "state); free space, or set trainer.checkpoint.dirpath to a larger disk"
            )
            if (self.saving.every_n_train_steps or self.saving.save_last) and num_nodes == 1:
                raise ValueError(message)
            warn_once(message)

    def verify_resume(self, path: Path, model: Any) -> None:
        """`verify_checkpoint` of the checkpoint to resume from."""
        verify_checkpoint(Path(path), model)

    def verify_init_from(self, model: Any) -> None:
        """trainer.init_from holds every weight of the configured model with its shape."""
        from lightning_dist.checkpoint.init_from import check_init_from

        check_init_from(self.init_from, model)

    def save_callbacks(self) -> list:
        """A ModelCheckpoint saving every `trainer.checkpoint.every_n_train_steps` steps (each
        kept as `step<N>.ckpt`, so the run can be resumed from any of them) and/or `last.ckpt`
        at the end; none when neither is set."""
        every = self.saving.every_n_train_steps
        if not (every or self.saving.save_last):
            return self.fence_callbacks()
        return [
            *self.fence_callbacks(),
            RetainingCheckpoint(
                self,
                dirpath=self.dirpath,
                filename="step{step}",
                auto_insert_metric_name=False,
                every_n_train_steps=every or None,
                save_top_k=-1 if every else 0,
                save_last=self.saving.save_last,
                # A resumed or restarted run rewrites step<N>.ckpt and last.ckpt, never `-v1`.
                enable_version_counter=False,
            ),
        ]

    def prune(self) -> list[Path]:
        """Delete the step<N>.ckpt folders older than the `keep_last` newest complete ones
        (incomplete ones too: an interrupted save); never a newer incomplete one (a save in
        progress) or a weights-only one. Returns what it deleted. Call on global rank 0."""
        import shutil

        if not self.saving.keep_last:
            return []
        steps = step_folders(self.dirpath)
        complete = [step for step, entry in steps if is_complete(entry)]
        if len(complete) <= self.saving.keep_last:
            return []
        oldest_kept = complete[-self.saving.keep_last]
        removed = []
        for step, entry in steps:
            if step < oldest_kept and not is_weights_only(entry):
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink()
                removed.append(entry)
        return removed

    def fence_callbacks(self) -> list:
        """The fence that lets one world at a time write the folder (checkpoint/fence.py), for
        runs that save on a schedule or resume from the folder (restarts, elastic rounds)."""
        if not (self.saving.every_n_train_steps or self.saving.save_last or self.resume == "auto"):
            return []

        return [CheckpointFence(self.dirpath)]

    def start_callbacks(self, resuming: bool) -> list:
        """How the run starts from a checkpoint: resuming, the callback that puts Lightning's
        batch counters where the data continues (callbacks/resume_position.py); otherwise the
        one that loads trainer.init_from's weights once the model is placed, if set."""
        if resuming:
            from lightning_dist.callbacks.resume_position import ResumePosition

            return [ResumePosition()]
        if not self.init_from:
            return []
        from lightning_dist.checkpoint.init_from import InitFromCheckpoint

        return [InitFromCheckpoint(self.init_from)]


class RetainingCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, and after each save one console line and the pruning of
    older checkpoints (`RunCheckpoints.prune`). A ModelCheckpoint, so Lightning runs it after
    the other callbacks: a preemption save at the same step is pruned too."""

    def __init__(self, checkpoints: RunCheckpoints, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.checkpoints = checkpoints

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        before = self.best_model_path
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if trainer.is_global_zero and self.best_model_path != before:
            removed = self.checkpoints.prune()
            print(
                saved_line(Path(self.best_model_path), removed, self.checkpoints.saving.keep_last),
                flush=True,
            )


def saved_line(path: Path, removed: list[Path], keep_last: int | None) -> str:
    """The console line of one save: where, how big, what pruning removed."""
    if is_complete(path) or path.is_file():
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files) / 2**20
        line = f"checkpoint saved: {path} ({size:,.1f} MiB)"
    else:
        line = f"checkpoint {path} is being written in the background"
    if removed:
        names = ", ".join(p.name for p in removed)
        line += f"; removed {names} (trainer.checkpoint.keep_last={keep_last})"
    return line


def verify_checkpoint(path: Path, model: Any) -> None:
    """A checkpoint to resume from is complete, unchanged since it was written, of a format
    version this code reads, and of the model's shapes (`model` a spec with `build()`);
    CheckpointError (a ValueError) naming the problem otherwise. Runs on every rank before any
    process group exists."""
    import torch

    from lightning_dist.checkpoint.weights import (
        CheckpointError,
        architecture_difference,
        model_args_of,
        model_overrides,
    )

    try:
        theirs = model_args_of(open_manifest(path))  # reads every file to hash it
    except PermissionError as e:
        raise cannot_read(path, e) from e
    require_resumable(path)  # an imported weights-only folder: trainer.init_from, not a resume
    difference = architecture_difference(theirs, model)
    if difference:
        raise CheckpointError(
            f"checkpoint {path} {difference}; resume it with its own model "
            f"({' '.join(model_overrides(theirs))})"
        )
    with torch.device("meta"):
        built = model.build()
    shapes = {f"{MODEL_PREFIX}{name}": tuple(t.shape) for name, t in built.state_dict().items()}
    check_model_shapes(path, shapes)  # reads DCP's .metadata, through the restricted reader
    require_lightning_state(path)  # a plain loop's folder: trainer.init_from too
