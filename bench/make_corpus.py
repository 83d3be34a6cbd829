"""Write a generated, text-like corpus and train a byte-level BPE on it, for bench/data_throughput.py.

Documents are runs of real text: consecutive lines of this interpreter's standard library
sources (code, comments and docstrings), several runs per document, document lengths drawn from
a log-normal (a few hundred bytes to tens of KiB, as web and code corpora have). Nothing is
downloaded. The same documents are written twice, as `jsonl/part-NNNNN.jsonl.zst` and as
`parquet/part-NNNNN.parquet`, in parts of about `--part-mb` MiB of text (prepare's parallelism
is across files). A byte-level BPE of `--vocab` entries is trained with `tokenizers` on the
first `--sample-mb` MiB and saved as `tokenizer.json`, with `<|endoftext|>` as its end of
document.

    python bench/make_corpus.py --size 2G --output bench/results/corpus

The output is never committed: bench/results/ is in .gitignore.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import sysconfig
import time
from pathlib import Path


def parse_size(text: str) -> int:
    """'2G', '100M', '512K' or a number of bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def source_lines(limit_files: int = 4000) -> list[str]:
    """Lines of the standard library's .py files (not site-packages), in file order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    lines: list[str] = []
    for path in files[:limit_files]:
        try:
            lines.extend(path.read_text(encoding="utf-8").splitlines(keepends=True))
        except (UnicodeDecodeError, OSError):
            continue
    return lines


def documents(lines: list[str], seed: int):
    """An endless stream of documents of varied length made of runs of real lines."""
    rng = random.Random(seed)
    n = len(lines)
    while True:
        target = int(min(max(rng.lognormvariate(7.6, 1.2), 120), 200_000))  # median ~2 KB
        parts, size = [], 0
        while size < target:
            start = rng.randrange(n)
            run = "".join(lines[start : start + rng.randint(3, 60)])
            parts.append(run)
            size += len(run)
        yield "\n".join(parts)[:target]


def write_corpus(output: Path, size: int, part_bytes: int, seed: int) -> list[Path]:
    """The JSON Lines (zstd) and Parquet parts; returns the JSONL parts."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    (output / "jsonl").mkdir(parents=True, exist_ok=True)
    (output / "parquet").mkdir(parents=True, exist_ok=True)
    stream = documents(source_lines(), seed)
    written, part, parts = 0, 0, []
    compressor = zstandard.ZstdCompressor(level=3)
    start = time.perf_counter()
    while written < size:
        batch, batch_bytes = [], 0
        while batch_bytes < min(part_bytes, size - written):
            doc = next(stream)
            batch.append(doc)
            batch_bytes += len(doc.encode())
        path = output / "jsonl" / f"part-{part:05d}.jsonl.zst"
        with open(path, "wb") as raw, compressor.stream_writer(raw) as out:
            for i, doc in enumerate(batch):
                out.write(json.dumps({"id": f"{part}-{i}", "text": doc}).encode() + b"\n")
        table = pa.table({"id": [f"{part}-{i}" for i in range(len(batch))], "text": batch})
        pq.write_table(
            table,
            output / "parquet" / f"part-{part:05d}.parquet",
            row_group_size=2048,
            compression="zstd",
        )
        parts.append(path)
        written += batch_bytes
        part += 1
        print(
            f"part {part}: {written / 2**20:,.0f} MiB of text, {time.perf_counter() - start:.0f} s",
            file=sys.stderr,
        )
    return parts


def train_tokenizer(output: Path, sample_bytes: int, vocab: int, seed: int) -> Path:
    """A byte-level BPE of `vocab` entries trained on `sample_bytes` of the same documents."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def sample():
        seen = 0
        for doc in documents(source_lines(), seed):
            if seen >= sample_bytes:
                return
            seen += len(doc)
            yield doc

    tokenizer.train_from_iterator(sample(), trainer=trainer)
    path = output / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="2G", help="bytes of text (default 2G)")
    parser.add_argument("--output", default="bench/results/corpus")
    parser.add_argument("--part-mb", type=int, default=64, help="MiB of text per part")
    parser.add_argument("--vocab", type=int, default=32768, help="BPE entries (32k-50k)")
    parser.add_argument("--sample-mb", type=int, default=32, help="MiB of text to train on")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    output = Path(args.output)
    start = time.perf_counter()
    parts = write_corpus(output, parse_size(args.size), args.part_mb << 20, args.seed)
    corpus_s = time.perf_counter() - start
    os.environ.setdefault("RAYON_NUM_THREADS", str(os.cpu_count() or 1))
    path = train_tokenizer(output, args.sample_mb << 20, args.vocab, args.seed)
    print(
        f"{len(parts)} parts in {output}/jsonl and {output}/parquet ({corpus_s:.0f} s); "
        f"tokenizer {path} ({time.perf_counter() - start - corpus_s:.0f} s)"
    )


if __name__ == "__main__":
    main()
