"""A finished run's PNG plots and markdown summary, without W&B: what `python -m
lightning_dist.report` (`lightning_dist/report.py`) writes, and what `run/finish.py` writes at
the end of every run. The report is as private as the run directory: of a private one
(`paths.private=true`, mode 0700) its folder is 0700 and its files 0600, whatever the umask."""

from __future__ import annotations

import contextlib
import csv
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

GIB = 1024**3
DEFAULT_WARN_RATIO = 0.3
"""The comm/compute ratio above which the telemetry warns (callbacks.comm.warn_ratio)."""


def load_metrics(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Each metric as (optimizer step, value) pairs, from the CSV every train.py run writes.

    Steps are 1-based like the console's: Lightning writes the N-th step's row at step N - 1.
    """
    from lightning_dist.run.loggers import METRICS_CSV
    from lightning_dist.runtime.record import LOGGER_STEP_OFFSET

    series: dict[str, list[tuple[int, float]]] = {}
    path = run_dir / METRICS_CSV
    if not path.exists():
        return series
    with path.open(newline="") as f:
        for row in csv.DictReader(f):  # one row per logging call; blank where not logged
            step = int(row.pop("step")) + LOGGER_STEP_OFFSET
            for key, value in row.items():
                if value != "":
                    series.setdefault(key, []).append((step, float(value)))
    return series


def run_label(run_dir: Path, summary: dict[str, Any]) -> str:
    """How titles name the run: its name (or run directory), strategy and model."""
    name = summary.get("run_name") or f"{run_dir.resolve().parent.name}/{run_dir.resolve().name}"
    return f"{name} ({summary.get('strategy')}, {summary.get('model')})"


def _plot_lines(
    path: Path,
    title: str,
    ylabel: str,
    lines: dict[str, list[tuple[int, float]]],
    reference: float | None = None,
    reference_label: str = "",
    xlabel: str = "optimizer step",
) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in lines.items():
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o" if len(points) < 30 else None, label=label)
    if reference is not None:
        ax.axhline(reference, color="black", linestyle="--", label=reference_label)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    if len(lines) > 1 or reference is not None:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_bars(
    path: Path,
    title: str,
    ylabel: str,
    labels: list[str],
    groups: dict[str, list[float]],
    reference: float | None = None,
    reference_label: str = "",
) -> None:
    """Bars for each label, one bar per group (side by side when there are several)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(groups), 1)
    for i, (group, values) in enumerate(groups.items()):
        xs = [x + (i - (len(groups) - 1) / 2) * width for x in range(len(labels))]
        ax.bar(xs, values, width=width, label=group if len(groups) > 1 else None)
    ax.set_xticks(range(len(labels)), labels)
    if reference is not None:
        ax.axhline(reference, color="black", linestyle="--", label=reference_label)
    if len(groups) > 1 or reference is not None:
        ax.legend()
    ax.set(title=title, ylabel=ylabel)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _comm_ratio_plot(path: Path, title: str, metrics: dict, warn_ratio: float) -> bool:
    """The comm/compute ratio in total and per mesh dimension, with the warning threshold:
    lines over the profiled steps, or bars when there are too few of them for a line."""
    series = {"all": metrics.get("comm/comm_compute_ratio", [])}
    for key in sorted(metrics):
        if (
            key.startswith("comm/")
            and key.endswith("_compute_ratio")
            and key != "comm/comm_compute_ratio"
        ):
            series[key.removeprefix("comm/").removesuffix("_compute_ratio")] = metrics[key]
    total = series["all"]
    if not total:
        return False
    if len(series) == 2:  # one dimension carries all the communication: one line for both
        (dim,) = [name for name in series if name != "all"]
        series = {f"all ({dim})": total}
    threshold = f"warning threshold {warn_ratio:.0%}"
    if len(total) <= 3:
        steps = [step for step, _ in total]
        groups = {
            name: [dict(points).get(s, 0.0) for s in steps] for name, points in series.items()
        }
        _plot_bars(
            path,
            title,
            "communication / compute",
            [f"step {s}" for s in steps],
            groups,
            reference=warn_ratio,
            reference_label=threshold,
        )
    else:
        _plot_lines(
            path,
            title,
            "communication / compute",
            series,
            reference=warn_ratio,
            reference_label=threshold,
        )
    return True


def is_private(run_dir: Path) -> bool:
    """Is the run directory its owner's alone (no group or other permission: `paths.private`,
    `lightning_dist/run/run_dir.py`)?"""
    return not run_dir.stat().st_mode & 0o077


@contextlib.contextmanager
def private_files(private: bool) -> Iterator[None]:
    """Create files and folders as the private run directory's own (0600/0700: the umask of
    `run.run_dir.PRIVATE_UMASK`) while inside, when `private`."""
    if not private:
        yield
        return
    from lightning_dist.run.run_dir import PRIVATE_UMASK

    umask = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(umask)


def write_report(run_dir: Path, out: Path) -> list[Path]:
    """Write every plot the run has data for, as private as the run directory; return the PNG
    paths."""
    private = is_private(run_dir)
    with private_files(private):
        written = _write_report(run_dir, out)
    if private:  # a report folder or file that existed before keeps its mode otherwise
        out.chmod(0o700)
        for path in [*written, out / "README.md"]:
            path.chmod(0o600)
    return written


def _write_report(run_dir: Path, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = load_metrics(run_dir)
    label = run_label(run_dir, summary)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def lines(name, title, ylabel, series):
        if any(series.values()):
            _plot_lines(out / name, f"{title}: {label}", ylabel, series)
            written.append(out / name)

    first = summary.get("first_step") or 0
    losses = list(enumerate(summary["losses"], start=first + 1))
    # A mixture of several sources: each one's validation loss too (val/loss/<name>).
    by_source = {
        f"validation: {key.removeprefix('val/loss/')}": points
        for key, points in metrics.items()
        if key.startswith("val/loss/")
    }
    lines(
        "loss.png",
        "loss",
        "cross-entropy",
        {"train": losses, "validation": metrics.get("val/loss", []), **by_source},
    )
    lines(
        "tokens_per_sec.png",
        "throughput",
        "tokens/s",
        {"tokens/s": metrics.get("throughput/tokens_per_sec", [])},
    )
    lines("mfu.png", "model FLOPs utilisation", "MFU", {"MFU": metrics.get("throughput/mfu", [])})
    warn = (summary.get("comm") or {}).get("warn_ratio", DEFAULT_WARN_RATIO)
    if _comm_ratio_plot(out / "comm_ratio.png", f"communication / compute: {label}", metrics, warn):
        written.append(out / "comm_ratio.png")
    peaks = summary.get("peak_memory_bytes") or []
    if peaks:
        _plot_bars(
            out / "memory_per_rank.png",
            f"peak memory per rank: {label}",
            "GiB",
            [f"rank {r}" for r in range(len(peaks))],
            {"peak": [p / GIB for p in peaks]},
        )
        written.append(out / "memory_per_rank.png")
    moe = summary.get("moe")
    if moe and moe["tokens_per_expert"]:
        imbalance = {
            f"layer {i}": metrics.get(f"moe/imbalance_layer{i}", []) for i in moe["layers"]
        }
        lines(
            "expert_imbalance.png",
            "expert load, max / mean tokens per expert",
            "max / mean",
            imbalance,
        )
        lines(
            "aux_loss.png",
            "load-balancing loss",
            "aux loss",
            {"aux loss": metrics.get("train/aux_loss", [])},
        )
        experts = [f"expert {e}" for e in range(len(moe["tokens_per_expert"][0]))]
        if len(experts) <= 32:  # one bar per expert and layer: readable up to a few dozen
            _plot_bars(
                out / "tokens_per_expert.png",
                f"tokens per expert, last step: {label}",
                "tokens",
                experts,
                dict(
                    zip(
                        [f"layer {i}" for i in moe["layers"]], moe["tokens_per_expert"], strict=True
                    )
                ),
            )
            written.append(out / "tokens_per_expert.png")
    bubble = summary.get("bubble")
    if bubble:
        stages = bubble["per_stage"]
        _plot_bars(
            out / "bubble.png",
            f"pipeline bubble per stage: {label}",
            "idle fraction",
            [f"stage {s}" for s in range(len(stages))],
            {"measured": stages},
            reference=bubble["theoretical"],
            reference_label="schedule (p-1)/(m+p-1)",
        )
        written.append(out / "bubble.png")
    (out / "README.md").write_text(markdown_summary(summary, written, label))
    return written


def write_loss_comparison(
    summaries: dict[str, dict[str, Any]], path: Path, title: str, smooth: int = 10
) -> Path:
    """One PNG of several runs' train losses against the tokens trained on (each summary.json's
    `losses`, a step being `global_batch_size` x `seq_len` tokens), as moving means over
    `smooth` steps, e.g. DiLoCo against DDP (bench/diloco.py). Returns `path`."""
    import matplotlib

    matplotlib.use("Agg")
    series = {}
    for name, summary in summaries.items():
        tokens = summary["global_batch_size"] * summary["seq_len"]
        losses = summary["losses"]
        series[name] = [
            ((i + 1) * tokens, sum(losses[max(0, i - smooth + 1) : i + 1]) / min(i + 1, smooth))
            for i in range(len(losses))
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    _plot_lines(path, title, f"train loss, mean of {smooth} steps", series, xlabel="tokens")
    return path


def markdown_summary(summary: dict[str, Any], plots: list[Path], label: str = "") -> str:
    def fmt(value, spec="{:.4g}"):
        return "n/a" if value is None else spec.format(value)

    comm = summary.get("comm", {})
    by_dim = comm.get("comm_compute_ratio_by_dim") or {}
    by_link = comm.get("comm_seconds_by_link") or {}
    nodes = summary.get("nodes") or {}
    rows = [
        ("strategy", summary.get("strategy")),
        ("hardware", summary.get("hardware")),
        ("model", summary.get("model")),
        ("parameters", fmt(summary.get("parameters"), "{:,}")),
        *_expert_rows(summary.get("moe"), fmt),
        ("layout", " ".join(f"{k}={v}" for k, v in summary.get("layout", {}).items())),
        ("world size", summary.get("world_size")),
        ("nodes", fmt(nodes.get("num_nodes"), "{}") + "".join(
            f", {d} {v['link'].replace('_', '-')}" for d, v in (nodes.get("mesh") or {}).items())),
        ("steps", summary.get("steps")),
        ("final loss", fmt(summary.get("final_loss"))),
        ("final loss, smoothed", fmt(summary.get("final_loss_smoothed"))),
        ("final validation loss", fmt(summary.get("final_val_loss"))),
        ("tokens/s", fmt(summary.get("tokens_per_sec"), "{:,.0f}")),
        ("MFU", fmt(summary.get("mfu"), "{:.1%}")),
        ("comm/compute", fmt(comm.get("comm_compute_ratio"), "{:.1%}")
         + "".join(f", {d} {r:.1%}" for d, r in by_dim.items())),
        ("comm time by link", ", ".join(f"{k.replace('_', '-')} {v * 1e3:.1f} ms"
                                        for k, v in by_link.items()) or "n/a"),
        ("peak memory (max rank)", fmt(max(summary.get("peak_memory_bytes") or [0]) / GIB, "{:.2f} GiB")),
        ("wall time", fmt(summary.get("wall_seconds"), "{:.0f} s")),
    ]  # fmt: skip
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    images = "\n".join(f"![{p.stem}]({p.name})" for p in plots)
    title = f"# Run report: {label}" if label else "# Run report"
    return f"{title}\n\n| | |\n| --- | --- |\n{table}\n\n{images}\n"


def _expert_rows(moe: dict[str, Any] | None, fmt) -> list[tuple[str, str]]:
    """The report's rows of a mixture of experts (summary.json's `moe`), none without one."""
    if not moe:
        return []
    imbalance = "n/a"
    if moe["imbalance"]:
        worst = max(range(len(moe["layers"])), key=moe["imbalance"].__getitem__)
        imbalance = f"{moe['imbalance'][worst]:.3f} (last step, layer {moe['layers'][worst]})"
    return [
        ("active parameters", fmt(moe["active_parameters"], "{:,}")),
        ("final aux loss", fmt(moe["final_aux_loss"])),
        ("expert imbalance (max/mean)", imbalance),
    ]
