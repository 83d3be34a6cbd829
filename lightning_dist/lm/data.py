"""Datasets and Lightning datamodules for causal language modelling.

Every sample is a window of `seq_len + 1` token ids; the model uses `w[:-1]` as inputs and
`w[1:]` as targets. Training batches come from `GlobalBatchSampler`, so the set of samples of
each optimizer step does not depend on the parallel layout. The Trainer must be built with
`use_distributed_sampler=False` so Lightning keeps these samplers as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import lightning.pytorch as pl
from torch.utils.data import DataLoader, Dataset, Subset

from lightning_dist.contract import contract_of
from lightning_dist.layout import batch_plan, per_rank_batch, warn_if_deprecated_batch_knob
from lightning_dist.lm.datasets import SyntheticTokens, TokenWindows
from lightning_dist.lm.sampling import GlobalBatchSampler
from lightning_dist.lm.token_cache import (
    TokenCache,
    build_token_cache,
    cache_key,
    file_sizes,
    find_files,
    open_token_cache,
    relative_names,
    resolve_files,
    split_files,
)
from lightning_dist.lm.tokenizer import describe, load_tokenizer

__all__ = [
    "GlobalBatchSampler",
    "LMDataModule",
    "SyntheticDataModule",
    "SyntheticTokens",
    "TextDataModule",
    "TokenWindows",
    "batch_plan",
    "resolve_files",
]

log = logging.getLogger(__name__)


class ValidationSplitTooSmall(ValueError):
    """The validation split holds less than one micro-batch for each data-parallel rank: the
    same on every rank, so `train()` reports it as one line (a configuration error)."""


class LMDataModule(pl.LightningDataModule):
    """Shared batching for the language-model datamodules.

    Subclasses fill `train_set` and `val_set` in `setup()`. Training uses `GlobalBatchSampler`;
    validation gives each data-parallel rank an equal, disjoint, contiguous shard of the first
    `val_batches * global_batch_size` validation windows, so the mean of the ranks' mean losses
    is the global mean.
    """

    def __init__(
        self,
        *,
        seq_len: int,
        global_batch_size: int,
        micro_batch_size: int | None,
        val_batches: int,
        seed: int,
        num_workers: int,
        per_rank_batch_size: int | None = None,
    ):
        super().__init__()
        warn_if_deprecated_batch_knob()
        micro_batch_size = per_rank_batch(per_rank_batch_size, micro_batch_size)
        if seq_len < 1:
            raise ValueError(f"data.seq_len={seq_len} must be at least 1")
        if val_batches < 1:
            raise ValueError(f"data.val_batches={val_batches} must be at least 1")
        # Catches a global batch that no layout could split, before any process group exists.
        batch_plan(global_batch_size, 1, micro_batch_size)
        self.seq_len = seq_len
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.val_batches = val_batches
        self.seed = seed
        self.num_workers = num_workers
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.tokenizer_vocab_size: int = 0
        self.resume_step = 0

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
            len(train_set), self.global_batch_size, micro, rank, size, seed=self.seed,
            start_step=self.resume_step, shares=self.dp_shares(),
        )  # fmt: skip
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


class TextDataModule(LMDataModule):
    """Windows of real text: files tokenized once into a memory-mapped cache.

    `paths` are files, directories or globs (see `resolve_files`; None means the standard
    library's `.py` files). `tokenizer` is a tokenizer.json path, or None for bytes.
    `pack_documents`: windows carry each token's document (a file; the tokenizer's end-of-text
    id ends each) and attention stays inside documents (`datasets.packed_window`).
    `vocab_size` is the model's vocabulary; a tokenizer with more ids raises ValueError.
    Files are resolved here, so a bad glob fails before training; the cache is built in
    `prepare_data()` (once per node) and opened in `setup()` (on every rank).
    """

    def __init__(
        self,
        *,
        paths: Sequence[str] | str | None = None,
        tokenizer: str | None = None,
        seq_len: int = 256,
        global_batch_size: int = 16,
        micro_batch_size: int | None = None,
        per_rank_batch_size: int | None = None,
        val_fraction: float = 0.02,
        val_batches: int = 4,
        cache_dir: str | None = None,
        follow_symlinks: bool = False,
        num_workers: int = 0,
        seed: int = 0,
        vocab_size: int | None = None,
        pack_documents: bool = False,
    ):
        super().__init__(
            seq_len=seq_len,
            global_batch_size=global_batch_size,
            micro_batch_size=micro_batch_size,
            per_rank_batch_size=per_rank_batch_size,
            val_batches=val_batches,
            seed=seed,
            num_workers=num_workers,
        )
        self.tokenizer = load_tokenizer(tokenizer)
        self.tokenizer_vocab_size = self.tokenizer.vocab_size
        if pack_documents and self.tokenizer.eos_id is None:
            raise ValueError(
                f"data.pack_documents=true needs an end-of-text token between documents, and "
                f"tokenizer {describe(self.tokenizer)} has none; use a tokenizer with one (or "
                "the byte-level one, data.tokenizer=null) or data.pack_documents=false"
            )
        self.separator = self.tokenizer.eos_id if pack_documents else None
        self.val_tokens: int | None = None
        """The validation split's tokens, known before tokenizing for the byte tokenizer."""
        if vocab_size is not None and self.tokenizer_vocab_size > vocab_size:
            raise ValueError(
                f"tokenizer vocabulary {self.tokenizer_vocab_size} ({describe(self.tokenizer)}) "
                f"is larger than model vocab_size={vocab_size}; use a model with vocab_size >= "
                f"{self.tokenizer_vocab_size} or a smaller tokenizer"
            )
        split_files([], val_fraction)  # validates the fraction now rather than at prepare time
        self.val_fraction = val_fraction
        self.files, skipped = find_files(paths, follow_symlinks=follow_symlinks)
        sizes = file_sizes(self.files)
        self.inputs = {
            "files": len(self.files),
            "bytes": sum(sizes),
            "first_paths": [str(f) for f in self.files[:5]],
            "skipped_symlinks": skipped,
        }
        """What the run reads: logged here and written to summary.json's `data`."""
        log.info(
            "Reading %d files, %d bytes (%s%s); %d symlinks leading out of data.paths skipped",
            len(self.files), sum(sizes), ", ".join(self.inputs["first_paths"]),
            ", ..." if len(self.files) > 5 else "", skipped,
        )  # fmt: skip
        # Read once here, before any process waits on another: the key, and the text check
        # (before the sizes: a small compressed file is refused as not text, not as too short).
        self.key = cache_key(self.files, self.tokenizer, val_fraction)
        self._check_splits(sizes, val_fraction)
        self.cache_dir = cache_dir
        self.cache: TokenCache | None = None

    def _check_splits(self, sizes: list[int], val_fraction: float) -> None:
        """Each split holds a window, checked now rather than after the processes start: from
        the file sizes, exactly for the byte tokenizer (one id per byte, plus end of text)."""
        where = f"data.paths ({len(sizes)} files, {sum(sizes)} bytes)"
        if sum(sizes) == 0:
            raise ValueError(f"{where} holds no text; add non-empty files to data.paths")
        if self.tokenizer.name != "byte":
            return  # other tokenizers' counts are known after tokenizing, in setup()
        per_file = [n + (self.tokenizer.eos_id is not None) for n in sizes]
        if len(per_file) == 1:
            held_out = max(1, int(per_file[0] * val_fraction))
            counts = {"train": per_file[0] - held_out, "val": held_out}
        else:
            is_val = split_files(relative_names(self.files), val_fraction)
            counts = {
                "train": sum(n for n, v in zip(per_file, is_val, strict=True) if not v),
                "val": sum(n for n, v in zip(per_file, is_val, strict=True) if v),
            }
        self.val_tokens = counts["val"]  # checked against the batch where it is known
        if counts["train"] < self.seq_len + 1:
            raise ValueError(
                f"{where}: the train split has {counts['train']} tokens, too few for one window "
                f"of data.seq_len={self.seq_len} (needs {self.seq_len + 1}); add text or lower "
                "data.seq_len"
            )

    more_validation = "raise data.val_fraction or add text"

    def validation_windows(self) -> int | None:
        if self.val_set is not None:
            return len(self.val_set)
        if self.val_tokens is None:
            return None
        return max(0, (self.val_tokens - 1) // self.seq_len)  # as TokenWindows counts them

    def prepare_data(self) -> None:
        """Tokenize the corpus into the cache unless an identical cache exists."""
        self.cache = build_token_cache(
            self.files, self.tokenizer, val_fraction=self.val_fraction, cache_dir=self.cache_dir,
            key=self.key,
        )  # fmt: skip

    def setup(self, stage: str | None = None) -> None:
        """Open the cached token files as memory maps (building them if prepare_data did not)."""
        if self.train_set is not None:
            return
        if self.cache is None:
            self.cache = open_token_cache(self.key, self.cache_dir)
        if self.cache is None:
            # Used without a Trainer, or the cache folder is not shared with local rank 0.
            self.prepare_data()
        self.train_set = TokenWindows(self.cache.tokens("train"), self.seq_len, split="train",
                                      separator=self.separator)  # fmt: skip
        val = self.cache.tokens("val")
        # Too short for one window: no validation windows (check_validation says so, if used).
        self.val_set = (
            TokenWindows(val, self.seq_len, split="val", separator=self.separator)
            if len(val) > self.seq_len else []
        )  # fmt: skip


class SyntheticDataModule(LMDataModule):
    """Deterministic random tokens: no files, no tokenizer; for tests, parity and benchmarks.
    `pack_documents`: windows of several documents, each ended by id `vocab_size - 1`
    (`datasets.SyntheticTokens`)."""

    more_validation = "raise data.val_samples"

    def __init__(
        self,
        *,
        vocab_size: int,
        seq_len: int = 128,
        global_batch_size: int = 8,
        micro_batch_size: int | None = None,
        per_rank_batch_size: int | None = None,
        num_samples: int = 4096,
        val_samples: int = 64,
        val_batches: int = 4,
        seed: int = 0,
        num_workers: int = 0,
        pack_documents: bool = False,
    ):
        super().__init__(
            seq_len=seq_len,
            global_batch_size=global_batch_size,
            micro_batch_size=micro_batch_size,
            per_rank_batch_size=per_rank_batch_size,
            val_batches=val_batches,
            seed=seed,
            num_workers=num_workers,
        )
        self.tokenizer_vocab_size = vocab_size
        self.num_samples = num_samples
        self.val_samples = val_samples
        # Build the datasets now: they are cheap and their arguments get checked before training.
        self.train_set = SyntheticTokens(
            num_samples, seq_len, vocab_size, seed, documents=pack_documents
        )
        self.val_set = SyntheticTokens(
            val_samples, seq_len, vocab_size, seed, offset=num_samples, documents=pack_documents
        )

    def setup(self, stage: str | None = None) -> None:
        """Nothing to do: the datasets are built in __init__."""
