"""A data source of `data.sources` (conf/data/mixture.yaml): each field declared once, with
`knob()`, and validated where the source is built (`DataSource`), naming the bad value as
`data.sources[<i>].<field>`. Plain Python, like the strategy option classes."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from lightning_dist.options.knobs import knob

SOURCE_FORMATS = ("text", "tokens", "jsonl", "parquet", "hf_disk", "megatron", "chat")
STREAMED_FORMATS = ("text", "jsonl", "parquet", "hf_disk")
"""The formats that `stream=true` tokenizes on the fly (the others are read as they are)."""
TOKEN_DTYPES = ("uint16", "uint32")


@dataclass(frozen=True, kw_only=True)
class DataSource:
    """One source of a mixture: where its documents are, how to read them, how often to draw."""

    path: str | list[str] | None = knob(
        None,
        "A file, a directory, a glob (** crosses directories), an fsspec URL of any of "
        "them (s3://bucket/prefix/*.jsonl.zst, copied into a local cache), or a list of them; "
        "format=text: null means the .py sources of Python's standard library.",
        hydra_type=Any,
    )
    format: str = knob(
        "text",
        "text (each file one document), tokens (a flat little-endian array of token "
        "ids, no header: nanoGPT's .bin), jsonl (field), parquet (field is the column), "
        "hf_disk (datasets.save_to_disk; field is the column) or megatron (an indexed "
        "dataset's .bin/.idx prefix) or chat (JSON Lines of {messages: [{role, content}, ...]} "
        "or {prompt, response}: supervised fine-tuning, the loss on the assistant's tokens "
        "only; docs/SFT.md).",
    )
    field: str | None = knob(
        None,
        "The JSON field or column that holds the text (jsonl, parquet, hf_disk); null means text.",
    )
    weight: float = knob(
        1.0,
        "Relative share of the training samples drawn from this source (normalised over "
        "the sources); a finite number above 0.",
    )
    name: str | None = knob(
        None,
        "The source's name in the logs (val/loss/<name>) and summary.json; null: the "
        "file or folder name of path.",
    )
    storage_options: dict[str, Any] | None = knob(
        None,
        "A URL path (s3://, gs://, any fsspec protocol; docs/DATA.md): keyword arguments "
        "of its fsspec filesystem, such as {endpoint_url: ...} or {anon: true}; null: the "
        "protocol's own configuration (for s3, the AWS environment and ~/.aws).",
        hydra_type=Any,
    )
    dtype: str | None = knob(
        None,
        "format=tokens: uint16 or uint32; null: uint16 when the model's vocabulary fits "
        "in it (model.vocab_size <= 65536), else uint32.",
    )

    stream: bool = knob(
        False,
        "Tokenize on the fly in the DataLoader workers instead of into the token cache "
        "first (formats text, jsonl, parquet, hf_disk): the first step starts in seconds on a "
        "corpus of any size, with the samples and resume position of a prepared source "
        "(docs/DATA.md, Streaming). Every data-parallel rank reads the whole stream and keeps "
        "its share, so at large data parallelism prepare the corpus instead.",
    )
    shuffle_windows: int = knob(
        1024,
        "stream=true: the most windows shuffled together, a chunk at a time (each chunk's "
        "order seeded by (seed, source, epoch, chunk); an epoch's chunks grow from 64 windows, "
        "doubling, to this); memory: shuffle_windows x (data.seq_len + 1) x 4 bytes per "
        "streamed source and rank (32 MiB at seq_len 8192). 1 reads the windows in file order.",
    )

    def label(self, index: int) -> str:
        """The name it is logged under: `name`, else the last part of `path` (of a glob: the
        folder it searches), else source<i>."""
        if self.name:
            return self.name
        if self.path and isinstance(self.path, str):
            # A URL's user:password@ (credentials) is never part of a name.
            path = re.sub(r"^([A-Za-z][A-Za-z0-9+.\-]*://)[^@]*@", r"\1", self.path)
            parts = path.rstrip("/").split("/")
            fixed = list(itertools.takewhile(lambda p: not set(p) & set("*?["), parts))
            tail = fixed[-1] if fixed else ""  # a glob is named by the folder it searches
            return tail or f"source{index}"
        return "stdlib" if self.path is None and self.format == "text" else f"source{index}"


def parse_sources(entries: Sequence[Mapping[str, Any] | DataSource] | None) -> list[DataSource]:
    """`data.sources` as `DataSource`s, checked: ValueError naming `data.sources[<i>]` for an
    unknown format or dtype, a weight that is not a finite number above 0, a source other than
    text without a path, and two sources of one name."""
    if not entries:
        raise ValueError("data.sources is empty; give at least one {path: ..., format: ...}")
    known = {f.name for f in fields(DataSource)}
    sources = []
    for i, entry in enumerate(entries):
        where = f"data.sources[{i}]"
        if not isinstance(entry, DataSource):
            entry = dict(entry)
            unknown = sorted(set(entry) - known)
            if unknown:
                raise ValueError(
                    f"{where} has no key {unknown[0]!r}; its keys are: {', '.join(sorted(known))}"
                )
            entry = DataSource(**entry)
        _check(entry, where)
        sources.append(entry)
    names = [s.label(i) for i, s in enumerate(sources)]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ValueError(
                f"data.sources[{i}] is named {name!r} like data.sources[{names.index(name)}]; "
                "give one of them another name (data.sources[i].name)"
            )
    chat = [i for i, s in enumerate(sources) if s.format == "chat"]
    streamed = [i for i, s in enumerate(sources) if s.stream]
    if chat and streamed:
        raise ValueError(
            f"data.sources[{chat[0]}] (format=chat) is mixed with data.sources[{streamed[0]}], "
            "which is streamed; a mixture with a chat source reads every source prepared "
            f"(data.sources[{streamed[0]}].stream=false)"
        )
    return sources


def _check(source: DataSource, where: str) -> None:
    if source.format not in SOURCE_FORMATS:
        raise ValueError(
            f"{where}.format={source.format!r} is not one of {', '.join(SOURCE_FORMATS)}"
        )
    w = source.weight
    if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w <= 0:
        raise ValueError(
            f"{where}.weight={w!r} must be a finite number above 0 (a source that should not "
            "be read is left out of data.sources)"
        )
    if source.path is None and source.format != "text":
        raise ValueError(f"{where} (format={source.format}) has no path; set {where}.path")
    if source.stream is not False and (
        source.stream is not True or source.format not in STREAMED_FORMATS
    ):
        raise ValueError(
            f"{where}.stream={source.stream!r}: streaming is true or false and reads formats "
            f"{', '.join(STREAMED_FORMATS)} (this source is {source.format}); set it to false"
        )
    n = source.shuffle_windows
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{where}.shuffle_windows={n!r} must be a whole number of windows >= 1")
    if source.dtype is not None and source.dtype not in TOKEN_DTYPES:
        raise ValueError(f"{where}.dtype={source.dtype!r} is not one of uint16, uint32 (or null)")
