"""The data configs' settings (`data.*` of conf/data/*.yaml): each declared once, with `knob()`,
in one of the option classes below, validated there with the bad value named as `data.<field>`.

`DATA_CONFIGS` says which classes each data config uses and where its defaults differ; the Hydra
schemas (`config/schemas.py`) and the datamodules (`lm/data.py`, which take the settings by name
or as option objects, routed by `data_options`) are both made from it. Plain Python, like the
strategy option classes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightning_dist.layout import batch_plan, per_rank_batch
from lightning_dist.options.data import DataSource, parse_sources
from lightning_dist.options.knobs import knob


@dataclass(frozen=True, kw_only=True)
class BatchOptions:
    """The windows every datamodule yields and how they are batched: `seq_len + 1` tokens each,
    `global_batch_size` of them per optimizer step, cut into per-rank batches."""

    seq_len: int = knob(
        256,
        "Tokens a window trains on: each sample holds seq_len + 1 ids, the inputs w[:-1] and "
        "the targets w[1:]; at least 1, at most model.max_seq_len.",
    )
    global_batch_size: int = knob(16, "Sequences per optimizer step, the same whatever the layout.")
    per_rank_batch_size: int | None = knob(
        None,
        "Sequences each data-parallel rank reads per step of its data loader: one forward, or "
        "under pp the batch cut into the pipeline's microbatches (so it is not Megatron's "
        "micro-batch there); the rest of the global batch is gradient accumulation. null means "
        "global_batch_size / data-parallel size (no accumulation).",
    )
    micro_batch_size: int | None = knob(
        None,
        "Deprecated name of per_rank_batch_size, still read (a deprecation line says so).",
        hydra_default="${.per_rank_batch_size}",
    )
    val_batches: int = knob(
        4,
        "Validation reads the first val_batches x global_batch_size windows of the validation "
        "split (fewer when the split is short: a warning says so); at least 1.",
    )
    num_workers: int = knob(
        0, "DataLoader worker processes per rank; 0 reads in the training process."
    )
    seed: int = knob(
        0,
        "Seed of the sample order (and of data=synthetic's tokens); the configs' default is "
        "the run's seed.",
        hydra_default="${seed}",
    )
    pack_documents: bool = knob(
        False,
        "Several documents per window, with rotary positions restarting at every document and "
        "attention that never crosses one; the loss is one device's under every layout. "
        "data=text: each file is a document, ended by the tokenizer's end-of-text token; "
        "data=synthetic: random lengths of 1 to seq_len / 2 + 1 ids, each ended by id "
        "vocab_size - 1. Needs a model that takes a document mask (ours; not Hugging Face "
        "models).",
    )

    def __post_init__(self) -> None:
        per_rank = per_rank_batch(self.per_rank_batch_size, self.micro_batch_size)
        if self.seq_len < 1:
            raise ValueError(f"data.seq_len={self.seq_len} must be at least 1")
        if self.val_batches < 1:
            raise ValueError(f"data.val_batches={self.val_batches} must be at least 1")
        # Catches a global batch that no layout could split, before any process group exists.
        batch_plan(self.global_batch_size, 1, per_rank)

    @property
    def per_rank(self) -> int | None:
        """One rank's batch: `per_rank_batch_size`, or its deprecated name where only that is
        set (None: the rank's whole share of the global batch)."""
        return per_rank_batch(self.per_rank_batch_size, self.micro_batch_size)


@dataclass(frozen=True, kw_only=True)
class CorpusOptions:
    """How the data configs that read documents (data=text, data=mixture) tokenize and split
    them."""

    tokenizer: str | None = knob(
        None, "Path to a Hugging Face tokenizer.json; null means byte-level (257 tokens)."
    )
    val_fraction: float = knob(
        0.02,
        "The last val_fraction of each source is held out for validation (whole files where a "
        "text source has several; a streamed record source: every 1/val_fraction-th record; "
        "docs/DATA.md).",
    )
    cache_dir: str | None = knob(
        None,
        "The token cache's folder (remote sources are copied into its remote/); null: "
        "$LIGHTNING_DIST_CACHE/tokens, else ~/.cache/lightning_dist/tokens.",
    )
    follow_symlinks: bool = knob(
        False,
        "Follow symlinks that lead out of a directory or glob root of the paths (off: skip them).",
    )


@dataclass(frozen=True, kw_only=True)
class TextOptions:
    """data=text: one text source."""

    paths: list[str] | str | None = knob(
        None,
        "Files, directories or globs; null means the .py sources of Python's standard library.",
        hydra_type=list[str] | None,
    )


@dataclass(frozen=True, kw_only=True)
class MixtureOptions:
    """data=mixture: weighted sources of any format (docs/DATA.md)."""

    skip_bad_records: bool = knob(
        False,
        "jsonl, parquet, hf_disk and chat sources: skip a malformed record (counted: one "
        "warning line per file; a streamed source's in summary.json's skipped_records and the "
        "run's closing lines) instead of stopping with its file:line (a stream: when it reaches "
        "it, keeping the steps trained); jsonl, parquet, hf_disk: a field missing from a file's "
        "first record stops either way.",
    )
    remote_cache_gib: float = knob(
        50.0,
        "Sources whose path is a URL (s3://, any fsspec protocol): the most their local "
        "copies, in <cache_dir>/remote/, may hold, in GiB; copies of earlier runs are evicted "
        "least recently used first. A run whose remote shards need more, or one shard above "
        "it, is refused before any download (every shard of a run is kept while it trains).",
    )
    sources: list[DataSource] = knob(
        [],
        "The sources and their weights (docs/DATA.md); each entry's keys are "
        "options.data.DataSource's fields.",
        hydra_type=list[DataSource],
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", parse_sources(self.sources))


@dataclass(frozen=True, kw_only=True)
class SyntheticOptions:
    """data=synthetic: deterministic random tokens."""

    num_samples: int = knob(4096, "Training windows (an epoch); drawn from the seed.")
    val_samples: int = knob(64, "Validation windows, drawn after the training ones.")


@dataclass(frozen=True)
class DataConfig:
    """A data config: the datamodule it builds, its option classes by their group name, and
    the defaults in which it differs from those classes."""

    target: str
    groups: dict[str, type]
    defaults: dict[str, Any] = dataclasses.field(default_factory=dict)

    def settings(self) -> list[tuple[type, dataclasses.Field]]:
        """(option class, field) of every setting, in order."""
        return [(cls, f) for cls in self.groups.values() for f in dataclasses.fields(cls)]

    def default(self, f: dataclasses.Field) -> Any:
        """A setting's Python default in this config (not the Hydra interpolation)."""
        if f.name in self.defaults:
            return self.defaults[f.name]
        if f.default is not dataclasses.MISSING:
            return f.default
        factory = f.default_factory
        assert callable(factory), f"{f.name} has no default"
        return factory()


_DATA = "lightning_dist.lm.data."
DATA_CONFIGS: dict[str, DataConfig] = {
    "text": DataConfig(
        _DATA + "TextDataModule",
        {"batch": BatchOptions, "corpus": CorpusOptions, "text": TextOptions},
    ),
    "mixture": DataConfig(
        _DATA + "MixtureDataModule",
        {"batch": BatchOptions, "corpus": CorpusOptions, "mixture": MixtureOptions},
    ),
    "synthetic": DataConfig(
        _DATA + "SyntheticDataModule",
        {"batch": BatchOptions, "synthetic": SyntheticOptions},
        {"seq_len": 128, "global_batch_size": 8},
    ),
}
"""Each data config's option classes, by the name of its schema (conf/data/<file>.yaml extends
`/schema_<name>`)."""


def data_options(config: str, settings: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """Each option class of data config `config`, built from `settings`: a setting by its name
    (`seq_len=8`), or a whole class by its group name (`batch=BatchOptions(...)`), not both.
    TypeError for a name the config does not have (naming the ones it has), ValueError for a
    bad value."""
    spec = DATA_CONFIGS[config]
    group_of = {
        f.name: group for group, cls in spec.groups.items() for f in dataclasses.fields(cls)
    }
    routed: dict[str, dict[str, Any]] = {group: {} for group in spec.groups}
    given: dict[str, Any] = {}
    for name, value in settings.items():
        if name in spec.groups and isinstance(value, spec.groups[name]):
            given[name] = value
        elif name in group_of:
            routed[group_of[name]][name] = value
        else:
            raise TypeError(
                f"{owner} has no setting {name!r}; its settings are: {', '.join(group_of)} "
                f"(or option objects: {', '.join(f'{g}=' for g in spec.groups)})"
            )
    built: dict[str, Any] = {}
    for group, cls in spec.groups.items():
        if group in given:
            if routed[group]:
                raise TypeError(
                    f"{owner}: pass {group}= or its settings ({', '.join(routed[group])}), not both"
                )
            built[group] = given[group]
            continue
        names = {f.name for f in dataclasses.fields(cls)}
        defaults = {k: v for k, v in spec.defaults.items() if k in names}
        built[group] = cls(**{**defaults, **routed[group]})
    return built
