"""Datasets and Lightning datamodules for causal language modelling.

Every sample is a window of `seq_len + 1` token ids; the model uses `w[:-1]` as inputs and
`w[1:]` as targets. Training batches come from `GlobalBatchSampler` (a mixture of sources:
`MixtureSampler`, its kind), so the set of samples of each optimizer step does not depend on
the parallel layout. The Trainer must be built with
`use_distributed_sampler=False` so Lightning keeps these samplers as they are.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import numpy as np
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset

from lightning_dist.contract import contract_of
from lightning_dist.layout import batch_plan, warn_if_deprecated_batch_knob
from lightning_dist.lm.chat import ChatWindows, LossScaledSampler, MixedChat, with_loss_masks
from lightning_dist.lm.datasets import SplitTooSmall, SyntheticTokens, TokenWindows, WindowSet
from lightning_dist.lm.mixture import MixturePlan, MixtureSampler
from lightning_dist.lm.sampling import GlobalBatchSampler
from lightning_dist.lm.sources import build_source, checked_tokenizer, local_specs
from lightning_dist.lm.streaming import StreamedMixture
from lightning_dist.lm.token_cache import resolve_files
from lightning_dist.options.data import DataSource
from lightning_dist.options.datamodules import (
    DATA_CONFIGS,
    BatchOptions,
    MixtureOptions,
    data_options,
)

__all__ = [
    "GlobalBatchSampler",
    "LMDataModule",
    "MixtureDataModule",
    "SyntheticDataModule",
    "SyntheticTokens",
    "TextDataModule",
    "TokenWindows",
    "batch_plan",
    "resolve_files",
]

log = logging.getLogger(__name__)


class ValidationSplitTooSmall(SplitTooSmall):
    """The validation split holds less than one micro-batch for each data-parallel rank."""


def settings_signature(cls: type[LMDataModule]) -> inspect.Signature:
    """`cls.__init__`'s signature with its `**settings` spelt out as keyword-only parameters
    (its data config's defaults; `DATA_CONFIGS`)."""
    own = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert cls.data_config is not None
    spec = DATA_CONFIGS[cls.data_config]
    settings = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=spec.default(f))
        for _, f in spec.settings()
    ]
    rest = [p for p in own if p.kind is not inspect.Parameter.VAR_KEYWORD]
    return inspect.Signature([*rest, *settings])


class LMDataModule(pl.LightningDataModule):
    """Shared batching for the language-model datamodules.

    Subclasses fill `train_set` and `val_set` in `setup()`. Training uses `GlobalBatchSampler`;
    validation gives each data-parallel rank an equal, disjoint, contiguous shard of the first
    `val_batches * global_batch_size` validation windows, so the mean of the ranks' mean losses
    is the global mean.
    """

    data_config: str | None = None
    """The entry of `options.datamodules.DATA_CONFIGS` that gives the class its settings."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The signature lists every setting, read from the option classes, so help() and
        # editors show the keyword arguments without a hand-kept copy.
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("data_config") is not None:
            cls.__signature__ = settings_signature(cls)  # type: ignore[attr-defined]

    def __init__(self, *, batch: BatchOptions):
        super().__init__()
        self.batch = batch
        """The batching settings (`data.seq_len`, `data.global_batch_size`, ...)."""
        self.seq_len = batch.seq_len
        self.global_batch_size = batch.global_batch_size
        self.micro_batch_size = batch.per_rank
        self.val_batches = batch.val_batches
        self.seed = batch.seed
        self.num_workers = batch.num_workers
        self.train_set: WindowSet = None
        self.val_set: WindowSet = None
        self.tokenizer_vocab_size: int = 0
        self.resume_step = 0

    @classmethod
    def options(cls, settings: dict[str, Any]) -> dict[str, Any]:
        """The option classes of this datamodule, built from its keyword arguments (setting
        names, or option objects by group name: `options.datamodules.data_options`)."""
        warn_if_deprecated_batch_knob()
        assert cls.data_config is not None
        return data_options(cls.data_config, settings, cls.__name__)

    def state_dict(self) -> dict[str, int]:
        """Saved in checkpoints: the optimizer steps taken, so a resumed run reads on from there."""
        trainer = getattr(self, "trainer", None)
        return {"global_step": trainer.global_step} if trainer is not None else {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume_step = int(state.get("global_step", 0))

    def dp_rank_and_size(self) -> tuple[int, int]:
        """(rank, size) of this process in the data-parallel group; (0, 1) outside a Trainer."""
        trainer = getattr(self, "trainer", None)
        strategy = getattr(trainer, "strategy", None) if trainer is not None else None
        kwargs = getattr(strategy, "distributed_sampler_kwargs", None) if strategy else None
        if not kwargs:
            return 0, 1
        return int(kwargs.get("rank", 0)), int(kwargs.get("num_replicas", 1))

    def dp_shares(self) -> list[int] | None:
        """The micro-batches of every data-parallel rank per step when the strategy weights
        the ranks by speed (`strategy.dp_shares`); None for equal shares or outside a Trainer."""
        trainer = getattr(self, "trainer", None)
        strategy = getattr(trainer, "strategy", None) if trainer is not None else None
        weights = contract_of(strategy).dp_weights() if strategy is not None else None
        if not weights:
            return None
        _, k = batch_plan(self.global_batch_size, sum(weights), self.micro_batch_size)
        return [w * k for w in weights]

    def plan(self, dp_size: int | None = None) -> tuple[int, int]:
        """(micro_batch_size, grad_accumulation) for `dp_size` ranks (default: the Trainer's);
        under speed-weighted shares, this rank's accumulation."""
        if dp_size is None:
            dp_size = self.dp_rank_and_size()[1]
        shares = self.dp_shares()
        if shares is not None:
            micro = self.global_batch_size // sum(shares)
            return micro, shares[self.dp_rank_and_size()[0]]
        return batch_plan(self.global_batch_size, dp_size, self.micro_batch_size)

    def train_dataloader(self) -> DataLoader:
        """This rank's micro-batches, in optimizer-step order: LongTensor [m, seq_len + 1]."""
        self._ensure_setup()
        train_set = self.train_set
        rank, size = self.dp_rank_and_size()
        micro, _ = self.plan(size)
        sampler = GlobalBatchSampler(
            len(train_set),
            self.global_batch_size,
            micro,
            rank,
            size,
            seed=self.seed,
            start_step=self.resume_step,
            shares=self.dp_shares(),
        )
        return self._loader(train_set, sampler=sampler, batch_size=micro)

    more_validation = "give the validation split more windows"
    """How to give the validation split more windows (said by `check_validation`)."""

    def validation_windows(self) -> int | None:
        """Windows in the validation split (None: not known before `setup()`)."""
        return None if self.val_set is None else len(self.val_set)

    def check_validation(self, dp_size: int, micro: int) -> None:
        """`ValidationSplitTooSmall` in one line when the validation split (where its size is
        known) has less than one micro-batch of `micro` windows for each of `dp_size` ranks."""
        windows = self.validation_windows()
        if windows is not None and windows < dp_size * micro:
            raise ValidationSplitTooSmall(
                f"the validation split has {windows} windows of data.seq_len={self.seq_len}, "
                f"fewer than one micro-batch for each of {dp_size} data-parallel ranks "
                f"({dp_size} x {micro} = {dp_size * micro}); {self.more_validation}, lower "
                "data.per_rank_batch_size, or turn validation off with "
                "trainer.val_check_interval=null"
            )

    def val_dataloader(self) -> DataLoader:
        """This rank's shard of the validation windows, in micro-batches of the training size."""
        self._ensure_setup()
        val_set = self.val_set
        rank, size = self.dp_rank_and_size()
        micro, _ = self.plan(size)
        self.check_validation(size, micro)  # other tokenizers' counts are known only now
        wanted = self.val_batches * self.global_batch_size
        per_rank = min(wanted, len(val_set)) // (size * micro) * micro
        if per_rank * size < wanted:
            log.warning(
                "Validation uses %d windows, fewer than data.val_batches=%d x "
                "data.global_batch_size=%d: the split is short",
                per_rank * size,
                self.val_batches,
                self.global_batch_size,
            )
        shard = Subset(val_set, range(rank * per_rank, (rank + 1) * per_rank))
        return self._loader(shard, sampler=None, batch_size=micro)

    def _loader(self, dataset: Dataset, *, sampler, batch_size: int) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            shuffle=False,
            drop_last=True,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def _ensure_setup(self) -> None:
        # Lets the loaders work outside a Trainer (tests, notebooks) without a manual setup().
        if self.train_set is None or self.val_set is None:
            self.setup("fit")


class MixtureDataModule(LMDataModule):
    """A weighted mixture of data sources (`data.sources`; docs/DATA.md).

    Its settings are `options.datamodules.DATA_CONFIGS["mixture"]`'s (keyword arguments by
    name, or option objects: `batch=`, `corpus=`, `mixture=`); `vocab_size` is the model's.
    Each source is found and checked here (files, sizes, ids against `vocab_size`), so a bad
    one fails before training; text sources are tokenized in `prepare_data()` (once per node)
    and every source is opened in `setup()` (on every rank). Training draws each global batch
    from the sources by weight (`mixture.MixturePlan`: a function of (seed, step), not of the
    world size); validation reads every source's held-out windows, and the module logs each
    source's loss as `val/loss/<name>` when there are several. `where`: how errors name each
    source (default `data.sources[i]`; `data.paths` for `TextDataModule`).
    """

    data_config = "mixture"

    def __init__(
        self, *, vocab_size: int | None = None, where: Sequence[str] | None = None, **settings: Any
    ):
        built = self.options(settings)
        batch, corpus = built["batch"], built["corpus"]
        super().__init__(batch=batch)
        mixture = self.mixture_options(built)
        self.specs = mixture.sources
        self.tokenizer, self.separator = checked_tokenizer(
            corpus.tokenizer,
            pack_documents=batch.pack_documents,
            vocab_size=vocab_size,
            formats=[s.format for s in self.specs],
        )
        self.tokenizer_vocab_size = self.tokenizer.vocab_size
        self.val_fraction = corpus.val_fraction
        self.cache_dir = corpus.cache_dir
        where = list(where or (f"data.sources[{i}]" for i in range(len(self.specs))))
        self.specs = local_specs(
            self.specs, where, cache_dir=corpus.cache_dir, cap_gib=mixture.remote_cache_gib
        )
        self.sources = [
            build_source(
                spec,
                index=i,
                where=where[i],
                tokenizer=self.tokenizer,
                seq_len=batch.seq_len,
                val_fraction=corpus.val_fraction,
                cache_dir=corpus.cache_dir,
                follow_symlinks=corpus.follow_symlinks,
                vocab_size=vocab_size,
                skip_bad_records=mixture.skip_bad_records,
                seed=batch.seed,
                val_windows=batch.val_batches * batch.global_batch_size,
            )
            for i, spec in enumerate(self.specs)
        ]
        self.names = [source.name for source in self.sources]
        self.weights = [spec.weight for spec in self.specs]
        self.inputs: dict[str, Any] = {
            "sources": {
                s.name: {"format": spec.format, "weight": spec.weight, **s.inputs}
                for s, spec in zip(self.sources, self.specs, strict=True)
            }
        }
        """What the run reads: written to summary.json's `data`."""
        self.train_sets: list[WindowSet] = []
        self.val_sets: list[WindowSet] = []
        self.plan_of_samples: MixturePlan | None = None
        self.val_batch_sources: list[str] = []
        """The source of each of this rank's validation micro-batches, in order (several
        sources only): the module logs each one's loss under its name."""
        self._saved_mixture: dict[str, Any] | None = None
        self._saved_streams: dict[str, Any] | None = None

    def mixture_options(self, built: dict[str, Any]) -> MixtureOptions:
        """The sources and how they are read, from the built option classes."""
        return built["mixture"]

    more_validation = "raise data.val_fraction or add text"

    def validation_windows(self) -> int | None:
        """Windows in the validation split: counted once set up, else from each source's
        validation tokens where all are known before tokenizing (byte-level text)."""
        if self.val_set is not None:
            return len(self.val_set)
        tokens = [getattr(source, "val_tokens", None) for source in self.sources]
        known = [n for n in tokens if n is not None]
        if len(known) < len(tokens):
            return None
        return sum(max(0, (n - 1) // self.seq_len) for n in known)  # as TokenWindows counts

    def prepare_data(self) -> None:
        """Tokenize the text sources into the cache unless identical caches exist."""
        for source in self.sources:
            source.prepare()

    def setup(self, stage: str | None = None) -> None:
        """Open every source's windows (building caches prepare_data did not)."""
        if self.train_set is not None:
            return
        self.train_sets = [s.windows("train", self.separator) for s in self.sources]
        self.val_sets = [s.windows("val", self.separator) for s in self.sources]
        self.plan_of_samples = MixturePlan(
            [None if t is None else len(t) for t in self.train_sets],
            self.weights,
            self.global_batch_size,
            self.seed,
        )
        single = len(self.sources) == 1
        if any(t is None for t in self.train_sets):  # streamed sources: read while training
            self.train_set = StreamedMixture(
                self.plan_of_samples,
                self.train_sets,
                [
                    getattr(s, "spec", None) if t is None else None
                    for s, t in zip(self.sources, self.train_sets, strict=True)
                ],
                [getattr(s, "shuffle_windows", 1) for s in self.sources],
                seq_len=self.seq_len,
                num_workers=self.num_workers,
                separator=self.separator,
            )
        elif any(isinstance(t, ChatWindows) for t in self.train_sets):  # a loss mask for all
            self.train_set = with_loss_masks(self.train_sets, self.seq_len)
            self.val_set = with_loss_masks(self.val_sets, self.seq_len)
            return
        else:
            self.train_set = self.train_sets[0] if single else ConcatDataset(self.train_sets)
        self.val_set = self.val_sets[0] if single else ConcatDataset(self.val_sets)

    # --- the position in the stream, saved in checkpoints ------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The optimizer steps taken and each source's draws before the next one."""
        state: dict[str, Any] = dict(super().state_dict())
        if "global_step" in state and self.plan_of_samples is not None:
            state["mixture"] = {
                "names": list(self.names),
                "weights": [float(w) for w in self.weights],
                "drawn": self.plan_of_samples.drawn_at(state["global_step"]),
            }
            if isinstance(self.train_set, StreamedMixture) and self.train_set.streams:
                state["streams"] = self.train_set.positions_at(state["mixture"]["drawn"])
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._saved_mixture = state.get("mixture")
        self._saved_streams = state.get("streams")

    def train_dataloader(self) -> DataLoader:
        """This rank's micro-batches of the mixture, in optimizer-step order."""
        self._ensure_setup()
        plan = self.plan_of_samples
        assert plan is not None  # set up above
        saved, streams = self._saved_mixture, self._saved_streams
        if saved and self.resume_step:
            same = (saved["names"], saved["weights"]) == (
                self.names,
                [float(w) for w in self.weights],
            )
            if same and sum(saved["drawn"]) == self.resume_step * self.global_batch_size:
                plan.restore(self.resume_step, saved["drawn"])
            else:
                streams = None  # streams then read from their start up to the draws
                log.warning(
                    "The checkpoint's data mixture (sources %s, weights %s, %d samples drawn) "
                    "is not this run's (%s, %s, %d): the samples of step %d on are this run's",
                    saved["names"],
                    saved["weights"],
                    sum(saved["drawn"]),
                    self.names,
                    self.weights,
                    self.resume_step * self.global_batch_size,
                    self.resume_step + 1,
                )
        rank, size = self.dp_rank_and_size()
        micro, _ = self.plan(size)
        start, shares = self.resume_step, self.dp_shares()
        if isinstance(self.train_set, StreamedMixture):  # micro-batches come out collated
            rank_sampler = GlobalBatchSampler(
                self.global_batch_size, self.global_batch_size, micro, rank, size, shares=shares
            )
            self.train_set.start(rank_sampler, start, streams)
            return DataLoader(self.train_set, batch_size=None, num_workers=0)
        offsets = np.cumsum([0, *(len(t) for t in self.train_sets[:-1])]).tolist()
        if isinstance(self.train_set, ChatWindows | MixedChat):  # samples carry a loss scale
            sampler: MixtureSampler = LossScaledSampler(
                self.train_set, plan, offsets, micro, rank, size, start_step=start, shares=shares
            )
        else:
            sampler = MixtureSampler(
                plan, offsets, micro, rank, size, start_step=start, shares=shares
            )
        return self._loader(self.train_set, sampler=sampler, batch_size=micro)

    def val_dataloader(self) -> DataLoader:
        """This rank's share of every source's validation windows, source after source, each in
        whole micro-batches (`val_batch_sources` names the source of each)."""
        if len(self.sources) == 1:
            return super().val_dataloader()
        self._ensure_setup()
        rank, size = self.dp_rank_and_size()
        micro, _ = self.plan(size)
        wanted = self.val_batches * self.global_batch_size
        pieces: list[int] = []
        self.val_batch_sources, offset = [], 0
        for name, val_set in zip(self.names, self.val_sets, strict=True):
            per_rank = min(wanted, len(val_set)) // (size * micro) * micro
            if per_rank == 0:
                raise ValidationSplitTooSmall(
                    f"source {name!r} holds {len(val_set)} validation windows, fewer than one "
                    f"micro-batch for each of {size} data-parallel ranks ({size} x {micro}); "
                    "raise data.val_fraction or give the source more data"
                )
            start = offset + rank * per_rank
            pieces.extend(range(start, start + per_rank))
            self.val_batch_sources.extend([name] * (per_rank // micro))
            offset += len(val_set)
        return self._loader(Subset(self.val_set, pieces), sampler=None, batch_size=micro)

    def skipped_records(self) -> dict[str, dict[str, Any]]:
        """Streamed sources' bad records skipped while training (`data.skip_bad_records`): a
        count and the first one's file:line per source; a prepared source's are counted when
        it is tokenized, in its `warning:` line."""
        if isinstance(self.train_set, StreamedMixture):
            return self.train_set.skipped_records()
        return {}

    def mixture_summary(self, global_step: int) -> dict[str, Any] | None:
        """Each source's weight, samples drawn in `global_step` steps and share of the tokens
        trained on (every sample has `seq_len` targets): summary.json's `data_mixture`; None
        before `setup()`."""
        if self.plan_of_samples is None:
            return None
        drawn = self.plan_of_samples.drawn_at(global_step)
        total = max(sum(drawn), 1)
        weights = sum(self.weights)
        return {
            name: {"weight": w / weights, "samples": n, "token_share": n / total}
            for name, w, n in zip(self.names, self.weights, drawn, strict=True)
        }


class TextDataModule(MixtureDataModule):
    """Windows of real text: a mixture of one text source (`data=text`).

    Its settings are `options.datamodules.DATA_CONFIGS["text"]`'s (`paths`: see
    `resolve_files`); `vocab_size` is the model's, and a tokenizer with more ids raises
    ValueError. Files are resolved here, so a bad glob fails before training; the cache is
    built in `prepare_data()` (once per node) and opened in `setup()` (on every rank).
    """

    data_config = "text"

    def __init__(self, *, vocab_size: int | None = None, **settings: Any):
        super().__init__(vocab_size=vocab_size, where=["data.paths"], **settings)
        self.inputs = self.sources[0].inputs

    def mixture_options(self, built: dict[str, Any]) -> MixtureOptions:
        """One text source: `data.paths`."""
        paths = built["text"].paths
        entries = [paths] if isinstance(paths, str) else list(paths or [])
        return MixtureOptions(
            sources=[DataSource(path=entries or None, format="text", name="text")]
        )

    @property
    def files(self) -> list:
        """The corpus files, sorted."""
        return self.sources[0].files

    @property
    def key(self) -> str:
        """The token cache's content-hash key."""
        return self.sources[0].key

    @property
    def cache(self):
        """The token cache once prepared or opened (None before)."""
        return self.sources[0].cache

    def mixture_summary(self, global_step: int) -> dict[str, Any] | None:
        """None: one source has the whole share (summary.json keeps its `data` alone)."""
        return None


class SyntheticDataModule(LMDataModule):
    """Deterministic random tokens (`datasets.SyntheticTokens`): no files, no tokenizer; for
    tests, parity and benchmarks. Its settings are `options.datamodules.DATA_CONFIGS
    ["synthetic"]`'s (by name, or `batch=`, `synthetic=`); `vocab_size` is the model's."""

    more_validation = "raise data.val_samples"

    data_config = "synthetic"

    def __init__(self, *, vocab_size: int, **settings: Any):
        built = self.options(settings)
        batch, synthetic = built["batch"], built["synthetic"]
        super().__init__(batch=batch)
        self.tokenizer_vocab_size = vocab_size
        self.num_samples = synthetic.num_samples
        self.val_samples = synthetic.val_samples
        # Build the datasets now: they are cheap and their arguments get checked before training.
        seq_len, seed, documents = batch.seq_len, batch.seed, batch.pack_documents
        self.train_set = SyntheticTokens(
            synthetic.num_samples, seq_len, vocab_size, seed, documents=documents
        )
        self.val_set = SyntheticTokens(
            synthetic.val_samples,
            seq_len,
            vocab_size,
            seed,
            offset=synthetic.num_samples,
            documents=documents,
        )

    def setup(self, stage: str | None = None) -> None:
        """Nothing to do: the datasets are built in __init__."""
