"""The weighted mixture of sources: which window of which source each sample of the run is.

The run's samples form one stream, cut into global batches of `G = data.global_batch_size`:
step k owns samples kG .. kG + G - 1, whatever the number of ranks (ranks then take their
pieces of each step, as `GlobalBatchSampler` does). Sample n is drawn from the source whose
count lags its share most: the source s with the largest `w_s * (n + 1) - drawn_s` (the lowest
index on a tie), so after any n samples every source has within one sample of `w_s * n`. A
source's d-th draw is window `perm_e[d mod E]` of its epoch `e = d // E`, `perm_e` a seeded
permutation of its windows and E its windows rounded down to whole global batches (all of them
when it holds fewer than one): an exhausted source starts its next epoch in a new order. All of
it is a function of (seed, step) and the sources' sizes and weights, so a run resumed on any
number of ranks reads on where it stopped; the checkpoint holds each source's draws at the
saved step (`drawn`), so the resume need not replay the picks of every earlier sample.

One source of weight 1 reads exactly as `GlobalBatchSampler` (the same permutations, from
`seed + epoch`): `data=text` is a mixture of one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from lightning_dist.lm.sampling import GlobalBatchSampler

_MARKS = 256
"""Steps whose draws `MixturePlan` keeps (far more than a loader's prefetch)."""


class MixturePlan:
    """The source and window of every sample of the stream (see the module docstring)."""

    def __init__(
        self,
        lengths: Sequence[int | None],
        weights: Sequence[float],
        global_batch_size: int,
        seed: int = 0,
    ):
        if len(lengths) != len(weights) or not lengths:
            raise ValueError(f"{len(lengths)} source sizes for {len(weights)} weights")
        total = float(sum(weights))
        self.weights = [float(w) / total for w in weights]
        self.lengths = [None if n is None else int(n) for n in lengths]
        """Each source's training windows; None for a streamed source (`lm/streaming.py`),
        whose d-th draw is the d-th window of its stream (its epochs end where its files do)."""
        g = global_batch_size
        self.epoch_lengths = [n if n is None or n < g else n // g * g for n in self.lengths]
        self.global_batch_size = g
        self.seed = seed
        self._marks: dict[int, list[int]] = {0: [0] * len(lengths)}
        """Each source's draws before a step, for the steps last computed: the loader runs a
        few steps ahead of the checkpoint that asks for `drawn_at(global_step)`."""
        self._orders: dict[int, tuple[int, torch.Tensor]] = {}

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in one pass over every source's epoch together (Lightning's epoch)."""
        return max(sum(n or 0 for n in self.epoch_lengths) // self.global_batch_size, 1)

    def drawn_at(self, step: int) -> list[int]:
        """Each source's draws before optimizer step `step` (all samples of steps < step)."""
        if len(self.weights) == 1:
            return [step * self.global_batch_size]
        known = max(k for k in self._marks if k <= step)
        drawn = list(self._marks[known])
        for n in range(known * self.global_batch_size, step * self.global_batch_size):
            drawn[self._pick(drawn, n)] += 1
        self._mark(step, drawn)
        return list(drawn)

    def _mark(self, step: int, drawn: list[int]) -> None:
        self._marks[step] = list(drawn)
        if len(self._marks) > _MARKS:
            for old in sorted(self._marks)[1:-_MARKS]:  # step 0 stays: a replay's start
                del self._marks[old]

    def restore(self, step: int, drawn: Sequence[int]) -> None:
        """Start from a checkpoint's draws at `step` instead of replaying the picks before it."""
        if len(drawn) != len(self.weights) or sum(drawn) != step * self.global_batch_size:
            raise ValueError(f"draws {list(drawn)} do not make step {step} of this mixture")
        self._mark(step, [int(d) for d in drawn])

    def step_samples(self, step: int) -> list[tuple[int, int]]:
        """(source, window) of each of step `step`'s global batch, in stream order."""
        drawn = self.drawn_at(step)
        out = []
        for n in range(step * self.global_batch_size, (step + 1) * self.global_batch_size):
            source = self._pick(drawn, n)
            out.append((source, self._window(source, drawn[source])))
            drawn[source] += 1
        self._mark(step + 1, drawn)
        return out

    def _pick(self, drawn: list[int], n: int) -> int:
        if len(drawn) == 1:
            return 0
        lags = [w * (n + 1) - d for w, d in zip(self.weights, drawn, strict=True)]
        return int(np.argmax(lags))  # the first of equal lags: the same on every rank

    def _window(self, source: int, draw: int) -> int:
        epoch_length = self.epoch_lengths[source]
        if epoch_length is None:  # streamed: the stream itself is the order
            return draw
        epoch, position = divmod(draw, epoch_length)
        cached = self._orders.get(source)
        if cached is None or cached[0] != epoch:
            generator = torch.Generator().manual_seed(self._seed(source, epoch))
            cached = (epoch, torch.randperm(int(self.lengths[source] or 0), generator=generator))
            self._orders[source] = cached
        return int(cached[1][position])

    def _seed(self, source: int, epoch: int) -> int:
        # Source 0 keeps `GlobalBatchSampler`'s seeds (seed + epoch), so a one-source run
        # reads as before; the others mix (seed, source, epoch) so no two share an order.
        if source == 0:
            return self.seed + epoch
        mixed = np.random.SeedSequence([self.seed & (2**64 - 1), source, epoch])
        return int(mixed.generate_state(1, np.uint64)[0] >> 1)


class MixtureSampler(GlobalBatchSampler):
    """One data-parallel rank's sample indices of a mixture, step by step: `GlobalBatchSampler`'s
    cut of each global batch into (micro-step, rank) pieces, over the batches `plan` draws.
    Indices are into the sources' training windows laid end to end (`offsets[s]` + window)."""

    def __init__(
        self,
        plan: MixturePlan,
        offsets: Sequence[int],
        micro_batch_size: int,
        dp_rank: int,
        dp_size: int,
        start_step: int = 0,
        shares: Sequence[int] | None = None,
    ):
        super().__init__(
            sum(n or 0 for n in plan.lengths),
            plan.global_batch_size,
            micro_batch_size,
            dp_rank,
            dp_size,
            seed=plan.seed,
            start_step=start_step,
            shares=shares,
        )
        self.plan = plan
        self.offsets = list(offsets)

    @property
    def steps_per_epoch(self) -> int:
        return self.plan.steps_per_epoch

    def step_batch(self, step: int) -> torch.Tensor:
        """The global batch of optimizer step `step` (counted over all epochs)."""
        samples = self.plan.step_samples(step)
        return torch.tensor([self.offsets[s] + w for s, w in samples], dtype=torch.long)

    def __iter__(self) -> Iterator[int]:
        first = self.epoch * self.steps_per_epoch
        for step in range(max(self.start_step, first), first + self.steps_per_epoch):
            batch = self.step_batch(step)
            for micro_step in range(self.grad_accumulation):
                yield from self._slice(batch, 0, micro_step)
