"""Turn a finished run into PNG plots and a markdown summary, without W&B.

    python -m lightning_dist.report outputs/2026-11-30/12-00-00

reads the run directory's `metrics/metrics.csv` and `summary.json` and writes `report/*.png` and
`report/README.md` into it (or into `--out`).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

GIB = 1024**3


def load_metrics(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Each metric as (step, value) pairs, from the CSV that every train.py run writes."""
    from lightning_dist.loggers import METRICS_CSV

    series: dict[str, list[tuple[int, float]]] = {}
    path = run_dir / METRICS_CSV
    if not path.exists():
        return series
    with path.open(newline="") as f:
        for row in csv.DictReader(f):  # one row per logging call; blank where not logged
            step = int(row.pop("step"))
            for key, value in row.items():
                if value != "":
                    series.setdefault(key, []).append((step, float(value)))
    return series


def _plot_lines(path: Path, title: str, ylabel: str, lines: dict[str, list[tuple[int, float]]]):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in lines.items():
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="." if len(points) < 30 else None, label=label)
    ax.set(title=title, xlabel="optimizer step", ylabel=ylabel)
    ax.grid(alpha=0.3)
    if len(lines) > 1:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_bars(path: Path, title: str, ylabel: str, labels: list[str], values: list[float],
               reference: float | None = None, reference_label: str = "") -> None:  # fmt: skip
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(labels, values, color="tab:blue")
    if reference is not None:
        ax.axhline(reference, color="tab:red", linestyle="--", label=reference_label)
        ax.legend()
    ax.set(title=title, ylabel=ylabel)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(run_dir: Path, out: Path) -> list[Path]:
    """Write every plot the run has data for; return the PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = load_metrics(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def lines(name, title, ylabel, series):
        if any(series.values()):
            _plot_lines(out / name, title, ylabel, series)
            written.append(out / name)

    losses = list(enumerate(summary["losses"], start=1))
    lines("loss.png", "loss", "cross-entropy",
          {"train": losses, "validation": metrics.get("val/loss", [])})  # fmt: skip
    lines("tokens_per_sec.png", "throughput", "tokens/s",
          {"tokens/s": metrics.get("throughput/tokens_per_sec", [])})  # fmt: skip
    lines("mfu.png", "model FLOPs utilisation", "MFU", {"MFU": metrics.get("throughput/mfu", [])})
    lines("comm_ratio.png", "communication / compute", "ratio",
          {"comm/compute": metrics.get("comm/comm_compute_ratio", [])})  # fmt: skip
    peaks = summary.get("peak_memory_bytes") or []
    if peaks:
        _plot_bars(out / "memory_per_rank.png", "peak memory per rank", "GiB",
                   [f"rank {r}" for r in range(len(peaks))], [p / GIB for p in peaks])  # fmt: skip
        written.append(out / "memory_per_rank.png")
    bubble = summary.get("bubble")
    if bubble:
        stages = bubble["per_stage"]
        _plot_bars(out / "bubble.png", "pipeline bubble per stage", "idle fraction",
                   [f"stage {s}" for s in range(len(stages))], stages,
                   reference=bubble["theoretical"], reference_label="schedule (p-1)/(m+p-1)")  # fmt: skip
        written.append(out / "bubble.png")
    (out / "README.md").write_text(markdown_summary(summary, written))
    return written


def markdown_summary(summary: dict[str, Any], plots: list[Path]) -> str:
    def fmt(value, spec="{:.4g}"):
        return "n/a" if value is None else spec.format(value)

    comm = summary.get("comm", {})
    rows = [
        ("strategy", summary.get("strategy")),
        ("hardware", summary.get("hardware")),
        ("model", summary.get("model")),
        ("layout", " ".join(f"{k}={v}" for k, v in summary.get("layout", {}).items())),
        ("world size", summary.get("world_size")),
        ("steps", summary.get("steps")),
        ("final loss", fmt(summary.get("final_loss"))),
        ("tokens/s", fmt(summary.get("tokens_per_sec"), "{:,.0f}")),
        ("MFU", fmt(summary.get("mfu"), "{:.1%}")),
        ("comm/compute", fmt(comm.get("comm_compute_ratio"), "{:.1%}")),
        ("peak memory (max rank)", fmt(max(summary.get("peak_memory_bytes") or [0]) / GIB, "{:.2f} GiB")),
        ("wall time", fmt(summary.get("wall_seconds"), "{:.0f} s")),
    ]  # fmt: skip
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    images = "\n".join(f"![{p.stem}]({p.name})" for p in plots)
    return f"# Run report\n\n| | |\n| --- | --- |\n{table}\n\n{images}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_dist.report", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="a train.py run directory (has summary.json)")
    parser.add_argument("--out", type=Path, default=None, help="default: RUN_DIR/report")
    args = parser.parse_args(argv)
    if not (args.run_dir / "summary.json").exists():
        print(f"error: {args.run_dir} has no summary.json; is it a finished train.py run?",
              file=sys.stderr)  # fmt: skip
        return 2
    out = args.out or args.run_dir / "report"
    written = write_report(args.run_dir, out)
    print(f"wrote {len(written)} plots and README.md to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
