"""Global batches that do not depend on the layout.

The design promises that, for one seed and one `data.global_batch_size`, the samples of optimizer
step k are the same set whatever the number of data-parallel ranks and the micro-batch size. The
sampler gets there by drawing one permutation for everybody and carving each step's slice of it
into (micro-step, rank) pieces, instead of first splitting the data by rank as torch's
DistributedSampler does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler

from lightning_dist.layout import batch_plan


class GlobalBatchSampler(Sampler[int]):
    """Yields one data-parallel rank's sample indices, step by step and micro-step by micro-step.

    One permutation of `range(num_samples)` (seeded with `seed + epoch`, the same on every rank)
    is cut into global batches of `global_batch_size`; step k owns `perm[k*G:(k+1)*G]`. Inside it,
    micro-step a of rank r gets the `micro_batch_size` samples starting at `(a*dp_size + r)*m`.
    Use it with `DataLoader(batch_size=micro_batch_size, drop_last=True)`. The incomplete last
    global batch of an epoch is dropped. `start_step` (optimizer steps already taken, counted
    over all epochs) resumes a run: its epoch starts at the step after it.

    `shares` (speed-weighted data parallelism, `strategy.dp_shares`): the micro-batches of every
    rank per step, e.g. (6, 2); their sum x `micro_batch_size` is the global batch. Rank r then
    takes the `shares[r]` micro-batches after those of the ranks before it, so the step's
    samples are the same set as under equal shares.
    """

    def __init__(
        self,
        num_samples: int,
        global_batch_size: int,
        micro_batch_size: int,
        dp_rank: int,
        dp_size: int,
        seed: int = 0,
        shuffle: bool = True,
        start_step: int = 0,
        shares: Sequence[int] | None = None,
    ):
        super().__init__()
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank={dp_rank} is outside data-parallel size {dp_size}")
        if shares is None:
            _, self.grad_accumulation = batch_plan(global_batch_size, dp_size, micro_batch_size)
            self._first = None
        else:
            shares = list(shares)
            if len(shares) != dp_size or sum(shares) * micro_batch_size != global_batch_size:
                raise ValueError(
                    f"micro-batches per rank {shares} x {micro_batch_size} samples do not make "
                    f"data.global_batch_size={global_batch_size} over {dp_size} ranks"
                )
            self.grad_accumulation = shares[dp_rank]
            self._first = sum(shares[:dp_rank])
        if num_samples < global_batch_size:
            raise ValueError(
                f"the training set has {num_samples} samples, fewer than one global batch of "
                f"data.global_batch_size={global_batch_size}"
            )
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.seed = seed
        self.shuffle = shuffle
        self.start_step = start_step
        self.epoch = 0

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in one pass over the data."""
        return self.num_samples // self.global_batch_size

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation of `epoch` (Lightning calls this at each epoch start)."""
        self.epoch = epoch

    def order(self) -> torch.Tensor:
        """The permutation of the current epoch, shared by all ranks."""
        if not self.shuffle:
            return torch.arange(self.num_samples)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_samples, generator=generator)

    def step_indices(self, step: int, micro_step: int) -> list[int]:
        """This rank's samples for one micro-step of one optimizer step (of the current epoch)."""
        return self._slice(self.order(), step, micro_step)

    def rank_positions(self, micro_step: int) -> list[int]:
        """The positions in a step's global batch (0 .. G - 1) of this rank's `micro_step`."""
        return self._slice(torch.arange(self.global_batch_size), 0, micro_step)

    def _slice(self, perm: torch.Tensor, step: int, micro_step: int) -> list[int]:
        m = self.micro_batch_size
        if self._first is None:
            piece = micro_step * self.dp_size + self.dp_rank
        else:  # uneven shares: this rank's micro-batches follow those of the ranks before it
            piece = self._first + micro_step
        start = step * self.global_batch_size + piece * m
        return perm[start : start + m].tolist()

    def __iter__(self) -> Iterator[int]:
        perm = self.order()
        skip = min(
            max(self.start_step - self.epoch * self.steps_per_epoch, 0), self.steps_per_epoch
        )
        for step in range(skip, self.steps_per_epoch):
            for micro_step in range(self.grad_accumulation):
                yield from self._slice(perm, step, micro_step)

    def __len__(self) -> int:
        return self.steps_per_epoch * self.grad_accumulation * self.micro_batch_size
