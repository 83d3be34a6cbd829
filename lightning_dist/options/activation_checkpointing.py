"""The `activation_checkpointing` setting, parsed: which blocks recompute what in backward.

One description for the strategies (`parallel/activation_checkpoint.py` applies it to a model)
and the planner (which models its memory and time). Plain Python, no torch, so the planner can
read it on a laptop. The choices:

- `0` or `"none"` / `"off"`: off;
- `n` (an int) or `"full"` (= 1): blocks 0, n, 2n, ... of each model chunk keep only their input
  during forward and recompute their activations in backward;
- `"op"` (alias `"selective"`): every block is checkpointed, but the outputs of its matmuls,
  attention kernels and collectives are saved; only the cheap ops between them are recomputed;
- `"op_alternate"`: op-level, but only every other matmul of a block (the 1st, 3rd, ... in
  forward order) keeps its output; the others run again in backward. torchtitan's op policy:
  for Llama 3 8B about 40% less activation memory than "op" for about 12% more compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NAMES = {
    "none": ("none", 0),
    "off": ("none", 0),
    "full": ("full", 1),
    "op": ("op", 1),
    "selective": ("op", 1),
    "op_alternate": ("op", 1, True),
}


@dataclass(frozen=True)
class CheckpointChoice:
    """A parsed `activation_checkpointing` setting: what to recompute, and in which blocks."""

    mode: str
    """'none', 'full' (whole blocks) or 'op' (selective: matmul outputs saved)."""
    every_n: int
    """Blocks 0, n, 2n, ... are checkpointed; 0 when mode is 'none'."""
    alternate_matmuls: bool = False
    """Under 'op': save only the odd matmuls of a block (1st, 3rd, ... in forward order) and
    recompute the others ("op_alternate")."""

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    def __bool__(self) -> bool:
        # Code that read the planner's old boolean setting keeps working.
        return self.enabled

    @property
    def label(self) -> str:
        """The planner's name: 'none', 'full', 'op', 'op_alternate' or 'every_<n>' (full, every
        n-th block)."""
        if self.mode == "full" and self.every_n > 1:
            return f"every_{self.every_n}"
        return "op_alternate" if self.alternate_matmuls else self.mode

    @property
    def setting(self) -> int | str:
        """The value of `strategy.activation_checkpointing` that selects this choice."""
        if self.mode == "full" and self.every_n > 1:
            return self.every_n
        if self.alternate_matmuls:
            return "op_alternate"
        return {"none": 0, "full": "full", "op": "op"}[self.mode]

    def checkpointed(self, blocks: int) -> int:
        """How many of a model chunk's `blocks` blocks are checkpointed: 0, n, 2n, ..."""
        return math.ceil(blocks / self.every_n) if self.enabled and blocks > 0 else 0

    def last_checkpointed(self, blocks: int) -> int | None:
        """The index of the chunk's last checkpointed block (the first to recompute in
        backward), or None when none is."""
        if not self.checkpointed(blocks):
            return None
        return (blocks - 1) // self.every_n * self.every_n


def parse_activation_checkpointing(
    value, name: str = "activation_checkpointing"
) -> CheckpointChoice:
    """An int n >= 0 (0 off, n: every n-th block in full) or one of none, off, full, op,
    selective, op_alternate; raises ValueError naming the bad value and the choices."""
    if isinstance(value, CheckpointChoice):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return CheckpointChoice("none" if value == 0 else "full", value)
    if isinstance(value, str) and value.lower() in NAMES:
        return CheckpointChoice(*NAMES[value.lower()])
    raise ValueError(
        f"{name}={value!r} must be 0 (off), n (checkpoint every n-th block), "
        "'full' (every block), 'op' / 'selective' (save matmul outputs, recompute the rest), "
        "'op_alternate' (save every other matmul output) or 'none'"
    )
