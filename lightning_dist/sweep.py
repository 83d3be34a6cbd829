"""After a multirun: one table that compares its jobs, written beside them.

    python train.py -m strategy=ddp,fsdp,fsdp2 debug=fast
    python -m lightning_dist.sweep multirun/2026-11-30/12-00-00   # the same table again

`CompareJobs` is a Hydra callback (`hydra.callbacks` in conf/train.yaml): when a multirun ends
it reads every job's summary.json and writes `comparison.md` and `comparison.json` into the
sweep directory, next to the job folders, and prints the table. Only the overrides that differ
between jobs name a job; a job without summary.json (it failed) keeps its row, marked so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

try:
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # the table itself needs no Hydra
    _HydraCallback = object

GIB = 1024**3
TABLE = "comparison.md"
RECORD = "comparison.json"


def _job_dirs(sweep_dir: Path) -> list[Path]:
    jobs = [p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(jobs, key=lambda p: int(p.name))


def _overrides(job: Path) -> list[str]:
    path = job / ".hydra" / "overrides.yaml"
    if not path.exists():
        return []
    from omegaconf import OmegaConf

    return [str(item) for item in OmegaConf.load(path)]


def job_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    """One dict per job: its number, the overrides that differ between jobs, and the numbers
    the comparison shows (None where summary.json lacks them)."""
    jobs = _job_dirs(sweep_dir)
    overrides = {job: _overrides(job) for job in jobs}
    common = set.intersection(*(set(o) for o in overrides.values())) if jobs else set()
    rows = []
    for job in jobs:
        path = job / "summary.json"
        s = json.loads(path.read_text()) if path.exists() else {}
        peaks = s.get("peak_memory_bytes") or []
        rows.append(
            {
                "job": job.name,
                "overrides": [o for o in overrides[job] if o not in common],
                "status": s.get("status", "completed") if s else "no summary.json",
                "strategy": s.get("strategy"),
                "world_size": s.get("world_size"),
                "steps": s.get("steps"),
                "final_loss": s.get("final_loss"),
                "final_loss_smoothed": s.get("final_loss_smoothed"),
                "final_val_loss": s.get("final_val_loss"),
                "tokens_per_sec": s.get("tokens_per_sec"),
                "peak_memory_gib": max(peaks) / GIB if peaks else None,
                "mfu": s.get("mfu"),
                "wall_seconds": s.get("wall_seconds"),
            }
        )
    return rows


COLUMNS = (
    ("job", "job", "{}"),
    ("overrides", "overrides", "{}"),
    ("ranks", "world_size", "{}"),
    ("steps", "steps", "{}"),
    ("final loss", "final_loss", "{:.4f}"),
    ("smoothed", "final_loss_smoothed", "{:.4f}"),
    ("val loss", "final_val_loss", "{:.4f}"),
    ("tokens/s", "tokens_per_sec", "{:,.0f}"),
    ("peak GiB", "peak_memory_gib", "{:.2f}"),
    ("MFU", "mfu", "{:.1%}"),
    ("wall s", "wall_seconds", "{:.0f}"),
)
"""(header, row key, format) of the comparison table."""


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row[key]
    if key == "overrides":
        text = " ".join(value) or "(none)"
        return text if row["status"] == "completed" else f"{text} ({row['status']})"
    return "-" if value is None else fmt.format(value)


def comparison_table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of `job_rows`."""
    lines = [
        "| " + " | ".join(h for h, _, _ in COLUMNS) + " |",
        "| " + " | ".join("---" if k in ("job", "overrides") else "---:" for _, k, _ in COLUMNS)
        + " |",
    ]  # fmt: skip
    lines += ["| " + " | ".join(_cell(r, k, f) for _, k, f in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def write_comparison(sweep_dir: Path) -> str:
    """Write comparison.md and comparison.json into `sweep_dir`; return the table."""
    rows = job_rows(sweep_dir)
    table = comparison_table(rows)
    note = (
        "MFU is `-` where the hardware has no known peak FLOP/s (CPUs). `smoothed` is the mean "
        "loss of the last steps (summary.json's `final_loss_smoothed`).\n"
    )
    (sweep_dir / TABLE).write_text(f"# Sweep {sweep_dir}\n\n{table}\n\n{note}")
    (sweep_dir / RECORD).write_text(json.dumps(rows, indent=2) + "\n")
    return table


class CompareJobs(_HydraCallback):
    """Hydra callback: the comparison table when a multirun ends."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        table = write_comparison(sweep_dir)
        print(
            f"\n{len(_job_dirs(sweep_dir))} jobs, compared in {sweep_dir / TABLE}:\n{table}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_dist.sweep", description=__doc__)
    parser.add_argument("sweep_dir", type=Path, help="a multirun directory (holds 0/, 1/, ...)")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir() or not _job_dirs(args.sweep_dir):
        print(f"error: {args.sweep_dir} holds no job folders (0/, 1/, ...)", file=sys.stderr)
        return 2
    print(write_comparison(args.sweep_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
