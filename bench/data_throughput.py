"""Does preparation keep up? tokens/s per worker and peak RSS of `python -m lightning_dist.data
prepare` with 1 and 2 workers, and tokens/s of reading the prepared shards.

Each repeat runs every worker count once, in turn (1 2, then 2 1, ...), so drift on a shared
machine hits all alike; medians with min..max come last. tokens/s is the tokens written over
the command's whole wall time (interpreter and worker start included). Peak RSS is the largest
sum, sampled every 20 ms from /proc, of the resident memory of the prepare process and all its
children (shared library pages are counted once per process, so the sum is an upper bound).
tokens per CPU second (user + system time of the command and its workers) does not depend on
how loaded the machine is: equal for 1 and 2 workers means the work splits without overhead.

    python bench/make_corpus.py --size 100M --part-mb 4        # the corpus and tokenizer
    python bench/data_throughput.py --files 4 --repeats 5

Beside each repeat, a control runs the bare tokenizer (no prepare code) in 1 and then 2
processes: its ratio is the most the machine gives two processes at that moment. The 2 GB
acceptance run (docs/DATA_PREPARE.md, "At scale") adds `--first-step`: a streamed run of one
optimizer step over the whole corpus, timed from launch.

`--loader` instead measures what the pre-flight reads: tokens/s of one loader worker (the
training DataLoader of `MixtureDataModule`, num_workers=0) per source format, over a corpus it
writes itself, and writes them to lightning_dist/data/loader_rates.json (`bench/loader_rates.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's lightning_dist, not an installed one
ONE_THREAD = {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
"""One tokenizer thread per process, as prepare starts its workers (data/prepare.py)."""


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and every descendant (0 for one that is gone)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += (
                int(next(ln for ln in status.splitlines() if ln.startswith("VmRSS")).split()[1])
                << 10
            )
            for task in os.listdir(f"/proc/{current}/task"):
                todo += [
                    int(c)
                    for c in Path(f"/proc/{current}/task/{task}/children").read_text().split()
                ]
        except (OSError, StopIteration, ValueError):
            continue
    return total


def run_prepare(files: list[str], fmt: str, tokenizer: str, workers: int, output: Path) -> dict:
    """One prepare command: seconds, tokens, tokens/s per worker, peak RSS of its process tree."""
    cmd = [sys.executable, "-m", "lightning_dist.data", "prepare", "--input", *files,
           "--format", fmt, "--tokenizer", tokenizer, "--output", str(output),
           "--workers", str(workers)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    cpu_before = _children_cpu_s()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.02)
    seconds = time.perf_counter() - start
    out, err = proc.communicate()
    cpu_s = _children_cpu_s() - cpu_before  # the command's and its workers' CPU seconds
    if proc.returncode:
        raise RuntimeError(f"prepare failed ({proc.returncode}): {err.decode()[-2000:]}")
    manifest = json.loads((output / "manifest.json").read_text())
    tokens = sum(s["tokens"] for s in manifest["shards"])
    return {"workers": workers, "seconds": seconds, "tokens": tokens,
            "tokens_per_s_per_worker": tokens / seconds / workers, "peak_rss": peak,
            "tokens_per_cpu_s": tokens / cpu_s}  # fmt: skip


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # waited-for descendants included
    return usage.ru_utime + usage.ru_stime


def read_shards(folder: Path, seq_len: int = 2048) -> dict:
    """Every shard's tokens copied into (seq_len,) windows, as a loader would: tokens/s."""
    import numpy as np

    from lightning_dist.data.indexed import IndexedDataset
    from lightning_dist.data.manifest import load_manifests

    start = time.perf_counter()
    window, filled, tokens = np.zeros(seq_len, dtype=np.int64), 0, 0
    for shard in load_manifests(folder)["shards"]:
        data = IndexedDataset(folder / shard["name"])
        for i in range(len(data)):
            doc = data.get(i)
            while len(doc):
                take = min(len(doc), seq_len - filled)
                window[filled : filled + take] = doc[:take]
                filled, doc, tokens = (filled + take) % seq_len, doc[take:], tokens + take
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def tokenizer_alone(corpus: Path, parts: list[Path], processes: int) -> float:
    """The control: tokens/s of `processes` bare tokenizers (one thread each, no prepare code),
    each encoding the same first 4 MiB of documents twice, all at once. Their 2-to-1 ratio is
    what the machine allows at that moment: prepare's own ratio is read against it."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    args = (str(corpus / "tokenizer.json"), str(parts[0]), results)
    saved = {key: os.environ.get(key) for key in ONE_THREAD}
    os.environ.update(ONE_THREAD)
    try:
        procs = [context.Process(target=_encode_alone, args=args) for _ in range(processes)]
        for proc in procs:
            proc.start()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value
    rows = [results.get() for _ in procs]
    for proc in procs:
        proc.join()
    return sum(tokens for tokens, _ in rows) / max(seconds for _, seconds in rows)


def _encode_alone(tokenizer: str, part: str, results) -> None:
    from tokenizers import Tokenizer

    from lightning_dist.data.records import iter_documents

    texts, size = [], 0
    for text in iter_documents(part, "parquet" if part.endswith(".parquet") else "jsonl"):
        texts.append(text)
        size += len(text)
        if size >= 4 << 20:
            break
    encode = Tokenizer.from_file(tokenizer).encode_batch_fast
    start, tokens = time.perf_counter(), 0
    for _ in range(2):
        for i in range(0, len(texts), 64):
            tokens += sum(len(e.ids) for e in encode(texts[i : i + 64], add_special_tokens=False))
    results.put((tokens, time.perf_counter() - start))


def first_streamed_step(corpus: Path, fmt: str, workers: int, run_dir: Path) -> dict:
    """Seconds from launching `python -m lightning_dist` on the whole corpus as one streamed
    source (`stream=true`) to the end of a run of one optimizer step: an upper bound of the
    time to the first step (the interpreter's start and exit included)."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(corpus / "tokenizer.json")).get_vocab_size()
    tokenizer = corpus / "tokenizer.json"
    cmd = [sys.executable, "-m", "lightning_dist", "model=llama_debug",
           f"model.vocab_size={vocab}", "data=mixture", f"data.tokenizer={tokenizer}",
           f"data.sources=[{{path: {corpus / fmt}, format: {fmt}, stream: true}}]",
           f"data.num_workers={workers}", "data.seq_len=256", "data.global_batch_size=16",
           "trainer.max_steps=1", "trainer.val_check_interval=null", "logger=none",
           "callbacks=none", "strategy=single", "hardware.devices=1",
           f"hydra.run.dir={run_dir}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"the streamed run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {"workers": workers, "seconds": seconds}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}..{max(values):,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="bench/results/corpus", help="bench/make_corpus.py's")
    parser.add_argument("--format", default="jsonl", choices=["jsonl", "parquet"])
    parser.add_argument("--files", type=int, default=0, help="the first N parts (0: all)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--first-step",
        action="store_true",
        help="also time a streamed one-step run over the whole corpus",
    )
    parser.add_argument(
        "--loader",
        action="store_true",
        help="loader tokens/s per format (bench/loader_rates.py's options)",
    )
    if "--loader" in sys.argv:
        from bench.loader_rates import main as loader_main

        loader_main()
        return
    args = parser.parse_args()
    corpus = Path(args.corpus)
    parts = sorted((corpus / args.format).glob("part-*"))
    parts = parts[: args.files] if args.files else parts
    size = sum(p.stat().st_size for p in parts)
    print(
        f"{len(parts)} {args.format} parts, {size / 2**20:.1f} MiB on disk; tokenizer "
        f"{corpus / 'tokenizer.json'}; load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores"
    )
    runs: dict[int, list[dict]] = {w: [] for w in args.workers}
    control: list[float] = []
    with tempfile.TemporaryDirectory(dir=corpus) as tmp:
        for repeat in range(args.repeats):
            order = args.workers if repeat % 2 == 0 else args.workers[::-1]
            for workers in order:
                out = Path(tmp) / f"r{repeat}-w{workers}"
                run = run_prepare(
                    [str(p) for p in parts],
                    args.format,
                    str(corpus / "tokenizer.json"),
                    workers,
                    out,
                )
                runs[workers].append(run)
                if workers == 2 and 1 in args.workers:  # the control, beside each repeat
                    alone = [tokenizer_alone(corpus, parts, n) for n in (1, 2)]
                    control.append(alone[1] / alone[0])
                print(
                    f"repeat {repeat} workers {workers}: {run['tokens']:,} tokens in "
                    f"{run['seconds']:.1f} s, {run['tokens_per_s_per_worker']:,.0f} tokens/s "
                    f"per worker, {run['tokens_per_cpu_s']:,.0f} tokens per CPU second, peak RSS "
                    f"{run['peak_rss'] / 2**20:.0f} MiB",
                    flush=True,
                )
        reading = read_shards(out)
    print(
        "\nworkers: tokens/s per worker | tokens/s in all | tokens per CPU s | peak RSS MiB"
        " (median (min..max))"
    )
    for workers, rows in runs.items():
        per = [r["tokens_per_s_per_worker"] for r in rows]
        print(
            f"{workers}: {spread(per)} | {spread([p * workers for p in per])} | "
            f"{spread([r['tokens_per_cpu_s'] for r in rows])} | "
            f"{spread([r['peak_rss'] / 2**20 for r in rows])}"
        )
    if 1 in runs and 2 in runs:
        ratios = [
            b["tokens"] / b["seconds"] / (a["tokens"] / a["seconds"])
            for a, b in zip(runs[1], runs[2], strict=True)
        ]
        print(
            f"2 workers / 1 worker, tokens/s: median {statistics.median(ratios):.2f}x "
            f"({min(ratios):.2f}..{max(ratios):.2f}) over {len(ratios)} repeats"
        )
        print(
            f"control, 2 bare tokenizers / 1 (no prepare code, same moments): median "
            f"{statistics.median(control):.2f}x ({min(control):.2f}..{max(control):.2f}); "
            f"load average now {os.getloadavg()[0]:.1f}"
        )
    print(
        f"reading the shards: {reading['tokens_per_s']:,.0f} tokens/s "
        f"({reading['tokens']:,} tokens into 2048-token windows, one process)"
    )
    if args.first_step:
        with tempfile.TemporaryDirectory(dir=corpus) as tmp:
            for workers in (0, 2):
                run = first_streamed_step(corpus, args.format, workers, Path(tmp) / f"w{workers}")
                print(
                    f"streamed, data.num_workers={workers}: launch to the end of step 1 in "
                    f"{run['seconds']:.1f} s ({len(list((corpus / args.format).iterdir()))} "
                    f"files, {_tree_bytes(corpus / args.format) / 2**30:.2f} GiB on disk; load "
                    f"average {os.getloadavg()[0]:.1f})",
                    flush=True,
                )


def _tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


if __name__ == "__main__":
    main()
