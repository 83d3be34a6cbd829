"""Finding the checkpoint to resume from, and writing single-file checkpoints atomically.

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

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning.pytorch.plugins.io import TorchCheckpointIO

from lightning_dist._compat import LIGHTNING_CHECKPOINT_METADATA
from lightning_dist.checkpoint.format import is_weights_only
from lightning_dist.checkpoint.manifest import MANIFEST

STEP_NAME = re.compile(r"^step(\d+)\.ckpt$")
DCP_METADATA = ".metadata"


@dataclass
class ResumePoint:
    """The latest complete checkpoint of a folder and the incomplete ones passed over."""

    path: Path | None = None
    step: int = 0
    skipped: list[Path] = field(default_factory=list)
    weights_only: list[Path] = field(default_factory=list)

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
        if self.path is None:
            return f"trainer.resume=auto: no complete checkpoint yet, starting at step 0{skipped}"
        return f"trainer.resume=auto: resuming from {self.path} (step {self.step}){skipped}"


def is_complete(path: Path) -> bool:
    """A finished, resumable checkpoint: a folder with its manifest (written last) and its
    metadata files. A weights-only folder (no `meta.pt`) is not one (`format.is_weights_only`)."""
    return path.is_dir() and all(
        (path / name).is_file() for name in (MANIFEST, DCP_METADATA, LIGHTNING_CHECKPOINT_METADATA)
    )


def latest_checkpoint(dirpath: str | Path) -> ResumePoint:
    """The complete `step<N>.ckpt` with the largest N in `dirpath` (missing folder: none)."""
    found = ResumePoint()
    folder = Path(dirpath)
    if not folder.is_dir():
        return found
    candidates = []
    for entry in folder.iterdir():
        match = STEP_NAME.match(entry.name)
        if match:
            candidates.append((int(match.group(1)), entry))
    for step, entry in sorted(candidates, reverse=True):
        if is_complete(entry):
            if found.path is None:
                found.path, found.step = entry, step
        elif found.path is None:  # only the ones newer than the resume point matter
            if is_weights_only(entry):
                found.weights_only.append(entry)
            else:
                found.skipped.append(entry)
    return found


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch.save checkpoint IO, writing to `<name>.tmp` and renaming: a save that
    is interrupted leaves no file that looks complete."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        path = Path(path)
        temporary = path.with_name(path.name + ".tmp")
        super().save_checkpoint(checkpoint, temporary, storage_options)
        os.replace(temporary, path)
