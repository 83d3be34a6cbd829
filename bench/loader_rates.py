"""Loader tokens/s per worker for each source format: the table the pre-flight reads
(lightning_dist/data/loader_rates.json, `run/data_rate.py`).

For each format a corpus of the same text-like documents is written into a temporary folder
(text files, JSON Lines, zstd JSON Lines, Parquet, `datasets` on disk, flat tokens, a Megatron
indexed dataset), a `MixtureDataModule` is prepared (tokenized once, byte-level tokenizer, so
every format yields the same ids), and its training DataLoader (num_workers=0: one process, the
rate of one worker) is timed over `--batches` batches of `--batch` x `--seq-len` tokens, after
one warm-up batch. Prepared sources all serve memory-mapped token windows, so the rates differ
little; the tokenization itself happens before step 1 (its seconds are printed, not used).
`streamed` is a JSON Lines source with `stream: true`: its worker tokenizes while it loads
(byte-level here; a BPE tokenizer is slower: bench/data_throughput.py's control measures one).

    python bench/data_throughput.py --loader            # writes lightning_dist/data/loader_rates.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TABLE = ROOT / "lightning_dist" / "data" / "loader_rates.json"
WORDS = "the of and to in is that for it as was with be by on not he this are or his".split()


def documents(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(200, 2000))) for _ in range(n)]


def write_corpus(folder: Path, fmt: str, docs: list[str]) -> dict:
    """One source entry of `fmt` over `docs`, written under `folder`."""
    import numpy as np

    if fmt == "text":
        for i, doc in enumerate(docs):
            (folder / f"{i:05d}.txt").write_text(doc)
        return {"path": str(folder / "*.txt"), "format": "text"}
    if fmt == "streamed":  # JSON Lines tokenized while training (lm/streaming.py)
        return {**write_corpus(folder, "jsonl", docs), "stream": True}
    if fmt in ("jsonl", "jsonl.zst"):
        body = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
        path = folder / f"docs.{fmt}"
        if fmt == "jsonl.zst":
            import zstandard

            body = zstandard.ZstdCompressor().compress(body)
        path.write_bytes(body)
        return {"path": str(path), "format": "jsonl"}
    if fmt == "chat":  # each document a prompt (its first half) and a response (the rest)
        body = "".join(
            json.dumps({"prompt": d[: len(d) // 2], "response": d[len(d) // 2 :]}) + "\n"
            for d in docs
        )
        (folder / "chat.jsonl").write_text(body)
        return {"path": str(folder / "chat.jsonl"), "format": "chat"}
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": docs}), folder / "docs.parquet")
        return {"path": str(folder / "docs.parquet"), "format": "parquet"}
    if fmt == "hf_disk":
        import datasets

        datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(folder / "hf"))
        return {"path": str(folder / "hf"), "format": "hf_disk"}
    ids = [np.frombuffer(d.encode(), dtype=np.uint8).astype(np.uint16) for d in docs]
    if fmt == "tokens":
        np.concatenate(ids).astype("<u2").tofile(folder / "ids.bin")
        return {"path": str(folder / "ids.bin"), "format": "tokens"}
    from lightning_dist.data.indexed import write_indexed

    write_indexed(folder / "mega", ids, np.uint16)
    return {"path": str(folder / "mega"), "format": "megatron"}


def loader_rate(source: dict, cache: Path, *, seq_len: int, batch: int, batches: int) -> dict:
    """Seconds to prepare, and tokens/s of one loader worker, for one source."""
    from lightning_dist.lm.data import MixtureDataModule

    start = time.perf_counter()
    module = MixtureDataModule(
        sources=[source],
        seq_len=seq_len,
        global_batch_size=batch,
        vocab_size=512,
        cache_dir=str(cache),
        num_workers=0,
    )
    module.prepare_data()
    module.setup("fit")
    prepare_s = time.perf_counter() - start
    loader = module.train_dataloader()
    next(iter(loader))  # warm-up
    start, seen = time.perf_counter(), 0
    while seen < batches:  # the sampler may end before: start its next pass
        for _ in zip(range(batches - seen), loader, strict=False):
            seen += 1
    seconds = time.perf_counter() - start
    return {
        "tokens_per_s_per_worker": round(batches * batch * seq_len / seconds),
        "prepare_s": round(prepare_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loader", action="store_true", help="(data_throughput.py's switch)")
    parser.add_argument("--docs", type=int, default=400)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--output", default=str(TABLE))
    args = parser.parse_args()
    docs = documents(args.docs)
    formats = [
        "text",
        "jsonl",
        "jsonl.zst",
        "parquet",
        "hf_disk",
        "tokens",
        "megatron",
        "chat",
        "streamed",
    ]
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in formats:
            folder = Path(tmp) / fmt.replace(".", "_")
            folder.mkdir()
            source = write_corpus(folder, fmt, docs)
            rates[fmt] = loader_rate(
                source,
                Path(tmp) / "cache",
                seq_len=args.seq_len,
                batch=args.batch,
                batches=args.batches,
            )
            print(
                f"{fmt}: {rates[fmt]['tokens_per_s_per_worker']:,} tokens/s per worker "
                f"(prepared in {rates[fmt]['prepare_s']} s)",
                flush=True,
            )
    table = {
        "what": "tokens/s of one DataLoader worker of a prepared source, per format "
                "(bench/loader_rates.py); read by lightning_dist/run/data_rate.py",
        "command": "python bench/data_throughput.py --loader",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load average "
                   f"{os.getloadavg()[0]:.1f}",
        "seq_len": args.seq_len, "batch": args.batch, "batches": args.batches,
        "formats": {fmt: r["tokens_per_s_per_worker"] for fmt, r in rates.items()},
        "prepare_seconds": {fmt: r["prepare_s"] for fmt, r in rates.items()},
    }  # fmt: skip
    Path(args.output).write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
