"""One world writes a checkpoint folder at a time: a fencing token per world.

A restart, or an elastic job that shrinks or grows, starts a new world (a new set of ranks) on
the same checkpoint folder. If the old world is not quite gone (a node cut off by the network
that still trains, a keep-alive that split one job in two), both would write step<N>.ckpt
folders and `trainer.resume=auto` could resume a mix. So each world, as it starts, takes the
next number in `<folder>/.writers/`: it creates `<n>.json` (exclusively: of two worlds racing
for one number, one gets the next) describing itself. The highest number holds the folder.
Before every save, rank 0 reads the holder; a world that no longer holds the folder stops,
every rank at the same save, with one line naming the world that took over, and writes nothing.
It exits with `FENCED_OUT_EXIT_CODE`, non-zero: the job did not finish. torchrun restarts a
world that fails, and a restarted copy would claim the folder back from the world that replaced
it, so the fenced-out world leaves a mark (`<n>.fenced`, with its torchrun run id) and a world of
the same torchrun run refuses to claim the folder again: it stops before step 1 the same way.

Each checkpoint records its writer's number (`writer` in manifest.json), and each world the step
it resumed from. A world can still finish one save after another world has chosen its resume
point; `replaced_after` bounds such checkpoints (written by an older world, past the step a
newer world resumed from), and `trainer.resume=auto` passes over them. Saves with `weights_only=True`
skip the callbacks and so the fence; the project makes none.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from lightning_dist.checkpoint.safe import CheckpointError

WRITERS = ".writers"
FENCED_OUT_EXIT_CODE = 5
"""A fenced-out world did not finish its job; its restarts refuse to claim the folder back
(see the module doc)."""
RUN_ID = "TORCHELASTIC_RUN_ID"
"""torchrun's id of the job, the same in every world it restarts."""
WRITER_KEY = "checkpoint_writer"
"""The writer's number in a saved checkpoint's dict (and `writer` in its manifest)."""


class FencedOut(CheckpointError):
    """Another world has taken the checkpoint folder over since this one started."""


class FolderFence:
    """The writers' numbers of one checkpoint folder (see the module doc)."""

    def __init__(self, dirpath: Path):
        self.folder = Path(dirpath) / WRITERS

    def numbers(self) -> list[int]:
        """The numbers taken so far, in order."""
        if not self.folder.is_dir():
            return []
        names = (p.name.removesuffix(".json") for p in self.folder.glob("*.json"))
        return sorted(int(n) for n in names if n.isdigit())

    def holder(self) -> int:
        """The number of the world that holds the folder; 0 before any world took one."""
        return max(self.numbers(), default=0)

    def claim(self, world: dict[str, Any]) -> int:
        """Take the next number for the world `world` describes; returns it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        number = self.holder() + 1
        while True:
            try:
                flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
                fd = os.open(self.folder / f"{number}.json", flags, 0o600)  # as the run's files
            except FileExistsError:  # another world took this number first
                number += 1
                continue
            with os.fdopen(fd, "w") as f:
                json.dump({**world, "number": number, "started": time.time()}, f)
            return number

    def mark_fenced_out(self, number: int) -> None:
        """Record that world `number` was fenced out (best effort: the folder may be gone)."""
        run_id = self.world(number).get("run_id")
        try:
            (self.folder / f"{number}.fenced").write_text(json.dumps({"run_id": run_id}))
        except OSError:
            pass

    def fenced_out_run(self, run_id: str | None) -> int | None:
        """The number of a world of torchrun run `run_id` that was fenced out, or None."""
        if not run_id or not self.folder.is_dir():
            return None
        for mark in sorted(self.folder.glob("*.fenced")):
            try:
                if json.loads(mark.read_text()).get("run_id") == run_id:
                    return int(mark.name.removesuffix(".fenced"))
            except (OSError, ValueError):
                continue
        return None

    def world(self, number: int) -> dict[str, Any]:
        """What world `number` wrote about itself ({} if unreadable)."""
        try:
            return json.loads((self.folder / f"{number}.json").read_text())
        except (OSError, ValueError):
            return {}

    def describe(self, number: int) -> str:
        world = self.world(number)
        if not world:
            return f"world {number}"
        started = world.get("started")
        when = f", started {time.strftime('%H:%M:%S', time.localtime(started))}" if started else ""
        return (
            f"world {number} ({world.get('world_size')} ranks on {world.get('num_nodes')} "
            f"node(s){when})"
        )

    def check(self, number: int, holder: int) -> None:
        """FencedOut unless `holder` (read by rank 0 and broadcast) is `number`."""
        if holder == number:
            return
        if holder < number:  # the record of this world's claim is gone
            raise FencedOut(
                f"the checkpoint folder {self.folder.parent} no longer holds this world's claim "
                f"({self.folder / f'{number}.json'} is gone); this world stops without saving: "
                "restart the job to claim the folder again"
            )
        raise FencedOut(
            f"the checkpoint folder {self.folder.parent} is now written by "
            f"{self.describe(holder)}, which started after this {self.describe(number)}; "
            "this world stops without saving so that one world writes the folder (resume "
            "from that world's checkpoints)"
        )

    def replaced_after(self) -> dict[int, float]:
        """For each world's number, the last step it could write before a newer world replaced
        it: the earliest step a newer world resumed from (inf while none has). A checkpoint
        past that step, by that world, was saved after it had been replaced. One read of every
        claim, however many checkpoints are judged by it."""
        limits: dict[int, float] = {}
        earliest = float("inf")
        for number in sorted(self.numbers(), reverse=True):
            limits[number] = earliest
            resumed_from = self.world(number).get("resumed_from")
            if resumed_from is not None:
                earliest = min(earliest, resumed_from)
        return limits


class CheckpointFence(Callback):
    """Claims the folder once training starts (after a resume is loaded, so the claim records
    the step it resumed from) and checks the claim before every save."""

    def __init__(self, dirpath: Path):
        self.fence = FolderFence(dirpath)
        self.number: int | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        number, refused = None, None
        if trainer.is_global_zero:
            refused = self.fence.fenced_out_run(os.environ.get(RUN_ID))
            if refused is None:
                number = self.fence.claim(
                    {
                        "world_size": trainer.world_size,
                        "num_nodes": trainer.num_nodes,
                        "resumed_from": trainer.global_step,
                        "pid": os.getpid(),
                        "run_id": os.environ.get(RUN_ID),
                    }
                )
        refused = trainer.strategy.broadcast(refused)
        if refused is not None:  # a torchrun restart of a world that was fenced out
            raise FencedOut(
                f"the checkpoint folder {self.fence.folder.parent} was taken over from world "
                f"{refused} of this torchrun job ({RUN_ID}={os.environ.get(RUN_ID)}); this "
                "restart does not claim it back (resume from the newer world's checkpoints)"
            )
        self.number = trainer.strategy.broadcast(number)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        holder = self.fence.holder() if trainer.is_global_zero else None
        assert self.number is not None  # claimed in on_train_start, before any save
        try:
            self.fence.check(self.number, trainer.strategy.broadcast(holder))
        except FencedOut:
            if trainer.is_global_zero:
                self.fence.mark_fenced_out(self.number)
            raise
        checkpoint[WRITER_KEY] = self.number
