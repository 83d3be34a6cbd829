"""`python -m lightning_dist.data prepare ...`: tokenize a corpus into indexed token shards in N
worker processes (lightning_dist/data/prepare.py); `... verify DIR`: check a prepared folder's
checksums (lightning_dist/data/manifest.py).

    python -m lightning_dist.data prepare --input 'corpus/*.jsonl.zst' --format jsonl \\
        --field text --tokenizer tokenizer.json --output shards/ --workers 8

On a cluster, each node or Slurm array task prepares one slice into the same folder:
`--shard-index i --shard-count n` (by default taken from SLURM_ARRAY_TASK_ID/_COUNT).
Started again after a kill, prepare skips every finished shard.

Exit status: 0 when done, 2 for a bad option or input (one line `error: ...`).
"""

from __future__ import annotations

import argparse
import os
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_dist.data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="tokenize a corpus into token shards")
    prep.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="GLOB",
        help="files (folders for hf_disk); ** matches across folders",
    )
    prep.add_argument("--format", default="jsonl", help="text, jsonl, parquet or hf_disk")
    prep.add_argument("--field", help="the JSON field / column of the text (default: text)")
    prep.add_argument("--tokenizer", default="byte", help="a tokenizer.json, or byte (default)")
    prep.add_argument("--output", required=True, help="the folder of shards and manifest")
    prep.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    prep.add_argument("--shard-index", type=int, help="this slice (default: Slurm array task)")
    prep.add_argument("--shard-count", type=int, help="slices in all (default: Slurm array size)")
    prep.add_argument("--shard-tokens", type=int, help="tokens per shard (default 64 Mi)")
    prep.add_argument(
        "--skip-bad-records",
        action="store_true",
        help="skip malformed records, with a count, instead of stopping",
    )
    check = commands.add_parser("verify", help="check a prepared folder's shards")
    check.add_argument("folder")
    check.add_argument("--sizes-only", action="store_true", help="skip the sha256 checksums")
    return parser


def slice_of(index: int | None, count: int | None, env: dict[str, str]) -> tuple[int, int]:
    """(index, count): the options, else the Slurm array task, else the whole corpus. A task
    of `--array=MIN-MAX:STEP` is slice (ID - MIN) / STEP of COUNT (tasks 0, 4, 8, 12 of
    `--array=0-12:4` are slices 0..3 of 4)."""
    if index is None and "SLURM_ARRAY_TASK_ID" in env:
        offset = int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
        index = offset // int(env.get("SLURM_ARRAY_TASK_STEP", "1") or 1)
        count = count or int(env["SLURM_ARRAY_TASK_COUNT"])
    return (index or 0, count or 1)


def main(argv: list[str] | None = None) -> None:
    from lightning_dist.run.errors import report_config_error

    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "verify":
            from lightning_dist.data.manifest import verify

            merged = verify(args.folder, checksums=not args.sizes_only)
            tokens = sum(s["tokens"] for s in merged["shards"])
            state = "ok" if merged["complete"] else "ok so far (a prepare did not finish)"
            print(
                f"{args.folder}: {len(merged['shards'])} shards, {tokens:,} tokens of "
                f"{merged['tokenizer']['name']}: {state}"
            )
            return
        from lightning_dist.data.prepare import DEFAULT_SHARD_TOKENS, prepare

        index, count = slice_of(args.shard_index, args.shard_count, dict(os.environ))
        manifest = prepare(
            args.input,
            args.output,
            fmt=args.format,
            field=args.field,
            tokenizer=args.tokenizer,
            workers=args.workers,
            shard_index=index,
            shard_count=count,
            shard_tokens=DEFAULT_SHARD_TOKENS if args.shard_tokens is None else args.shard_tokens,
            skip_bad_records=args.skip_bad_records,
        )
        tokens = sum(s["tokens"] for s in manifest["shards"])
        print(f"{args.output}: {len(manifest['shards'])} shards, {tokens:,} tokens")
    except (ValueError, OSError) as e:  # ConfigError is a ValueError; a folder not writable
        report_config_error(e)


if __name__ == "__main__":
    main()
