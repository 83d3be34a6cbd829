"""Telemetry: interval arithmetic, MFU and bubble formulas, the one step clock that every
callback shares, and real runs: one in-process run whose progress lines, throughput logs and
summary.json read the same clock, and a 2-rank run in which a slowed rank is named as the
straggler, the comm/compute numbers reach summary.json and W&B, and the report turns the run
into PNGs."""

import csv
import statistics
from typing import Any

import pytest
import torch

from lightning_dist.callbacks.comm import CommComputeMonitor, theoretical_bubble
from lightning_dist.callbacks.context import RunContext, step_clock
from lightning_dist.callbacks.intervals import subtract, union_length, union_of
from lightning_dist.callbacks.progress import PlainProgress
from lightning_dist.callbacks.run_stats import RunStats
from lightning_dist.callbacks.throughput import ThroughputMFU
from lightning_dist.hardware import HardwareSpec
from lightning_dist.layout import Layout
from lightning_dist.models.args import ModelArgs
from lightning_dist.run.loggers import METRICS_CSV


def test_interval_union_and_difference():
    assert union_of([(3, 5), (0, 2), (1, 3), (7, 7)]) == [(0, 5)]
    assert union_length([(0, 2), (1, 3), (10, 11)]) == 4
    assert subtract([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    assert subtract([(0, 4)], [(0, 4)]) == []


def test_theoretical_bubble():
    assert theoretical_bubble(Layout(pp=2, microbatches=4, schedule="GPipe")) == pytest.approx(
        1 / 5
    )
    assert theoretical_bubble(Layout(pp=4, microbatches=8)) == pytest.approx(3 / 11)
    interleaved = Layout(pp=4, microbatches=8, virtual_stages=2, schedule="Interleaved1F1B")
    assert theoretical_bubble(interleaved) == pytest.approx(3 / 19)
    zero_bubble = Layout(pp=2, microbatches=4, virtual_stages=2, schedule="ZBVZeroBubble")
    # Zero-bubble schedules split the backward in three (F, I, W): (p-1)/(3mv+p-1), not 0.
    assert theoretical_bubble(zero_bubble) == pytest.approx(1 / 25)


def test_mfu_uses_palm_flops_and_dense_peak():
    args = ModelArgs(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_hidden_size=14336
    )
    h100 = HardwareSpec(name="dgx_h100", accelerator="gpu", devices=8, peak_tflops_bf16=989)
    ctx = RunContext(
        hardware=h100,
        layout=Layout(dp_shard=8),
        precision="bf16-mixed",
        seq_len=8192,
        global_batch_size=64,
        flops_per_token=args.train_flops_per_token(8192),
    )
    monitor = ThroughputMFU()
    monitor.bind(ctx)
    rates = monitor.rates(step_seconds=10.0, world_size=8)
    tokens_per_sec = 64 * 8192 / 10.0
    expected = args.train_flops_per_token(8192) * tokens_per_sec / (989e12 * 8)
    assert rates["tokens_per_sec"] == pytest.approx(tokens_per_sec)
    assert rates["mfu"] == pytest.approx(expected)
    cpu = RunContext(
        hardware=HardwareSpec(),
        layout=Layout(),
        precision="32-true",
        seq_len=8,
        global_batch_size=1,
        flops_per_token=1.0,
    )
    assert cpu.mfu(1000.0, 1) is None


def key_count(tree: Any, key: str) -> int:
    """How often `key` is a dict key anywhere in a nested JSON structure."""
    if isinstance(tree, dict):
        return sum((k == key) + key_count(v, key) for k, v in tree.items())
    if isinstance(tree, list):
        return sum(key_count(v, key) for v in tree)
    return 0


def read_metrics(run_dir) -> list[dict[str, float]]:
    """The rows of the run's metrics CSV, each with the metrics logged in it."""
    with (run_dir / METRICS_CSV).open(newline="") as f:
        return [
            {k: int(v) if k == "step" else float(v) for k, v in row.items() if v != ""}
            for row in csv.DictReader(f)
        ]


class FakeTrainer:
    """What the step clock reads of a Trainer."""

    def __init__(self) -> None:
        self.global_step = 0
        self.current_epoch = 0
        self.max_steps = 100
        self.is_global_zero = True
        self.strategy = type("Strategy", (), {"root_device": torch.device("cpu")})()


def test_step_clock_ticks_once_per_optimizer_step_in_any_callback_order():
    trainer = FakeTrainer()
    progress = PlainProgress(every_n_steps=1000)
    callbacks = [RunStats(tokens_per_step=8), ThroughputMFU(), CommComputeMonitor(), progress]
    for callback in callbacks:
        callback.on_train_start(trainer, None)
    clock = step_clock(trainer)
    assert all(c.clock is clock for c in callbacks)
    seen = {id(c): [] for c in callbacks}
    batch_idx = 0
    for step in range(1, 5):  # 4 optimizer steps of 3 micro-batches (gradient accumulation)
        for micro in range(3):
            trainer.global_step = step if micro == 2 else step - 1
            order = callbacks if step % 2 else callbacks[::-1]  # the order must not matter
            for callback in order:
                callback.on_train_batch_end(trainer, None, None, None, batch_idx)
                seen[id(callback)].append(callback.clock.tick(trainer, batch_idx))
            batch_idx += 1
    assert len(clock.end_times) == 4
    for flags in seen.values():
        assert flags == [False, False, True] * 4
    assert clock.end_times == sorted(clock.end_times) and len(clock.step_seconds()) == 4
    assert clock.steady_step_seconds() == statistics.median(clock.step_seconds()[1:])
    assert step_clock(FakeTrainer()) is not clock  # one clock per trainer


def test_progress_throughput_and_summary_read_one_clock(compose, tmp_path, fitted_trainers, capsys):
    """A real single-process run (2 micro-batches per step): every timing callback holds the
    trainer's one clock, and what each shows or writes is that clock's numbers."""

    from lightning_dist.train import train

    trainers = fitted_trainers
    cfg = compose(
        "model=llama_debug",
        "data=synthetic",
        "data.seq_len=32",
        "data.global_batch_size=4",
        "data.micro_batch_size=2",
        "strategy=single",
        "logger=none",
        "trainer.max_steps=6",
        "trainer.log_every_n_steps=1",
        "trainer.val_check_interval=null",
        "callbacks.progress.plain_every_n_steps=3",
        "callbacks.throughput.every_n_steps=3",
        "callbacks.comm.first_step=2",
    )
    summary = train(cfg)
    (trainer,) = trainers
    assert trainer.accumulate_grad_batches == 2
    clock = step_clock(trainer)
    by_type = {type(c): c for c in trainer.callbacks}
    for kind in (PlainProgress, ThroughputMFU, RunStats, CommComputeMonitor):
        assert by_type[kind].clock is clock, kind
    assert len(clock.end_times) == 6  # once per optimizer step, not per micro-batch

    steady, window = clock.steady_step_seconds(), clock.steady_step_seconds(last=3)
    assert summary["step_seconds"] == clock.step_seconds()
    assert summary["tokens_per_sec"] == pytest.approx(4 * 32 / steady, rel=1e-12)
    assert summary["throughput"]["step_seconds"] == steady
    assert key_count(summary, "tokens_per_sec") == key_count(summary, "mfu") == 1
    logged = float(trainer.callback_metrics["throughput/step_seconds"])  # at step 6
    assert logged == pytest.approx(window, rel=1e-6)
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step 6/6")]
    assert f"{window:.3f} s/step" in line
    comm = summary["comm"]["per_rank"][0]  # the profiled step 2 ended at the clock's tick
    assert 0 < comm["step_seconds"] <= clock.step_seconds()[1]
    assert any("lr-AdamW/pg1" in row for row in read_metrics(tmp_path))  # LearningRateMonitor


def test_a_run_with_no_progress_callback_gets_plain_lines_not_lightnings_rich_bar(compose):
    """callbacks=none: the progress display is train.py's own choice (plain lines when stdout is
    no terminal), not Lightning's stand-in, a Rich bar whose thread renders every second."""
    from lightning.pytorch.callbacks import ProgressBar

    from lightning_dist.run.build import run_callbacks
    from lightning_dist.run.plan import plan_run

    for choice in ("none", "default"):
        cfg = compose(
            "model=llama_debug", "data=synthetic", "strategy=single", f"callbacks={choice}"
        )
        callbacks = run_callbacks(plan_run(cfg), RunStats(tokens_per_step=1))
        bars = [type(c) for c in callbacks if isinstance(c, ProgressBar)]
        assert bars == [PlainProgress], choice  # pytest captures stdout: no terminal


@pytest.mark.parametrize(("step", "measured"), [("2", [2]), ("0", [])])
def test_memory_by_category_measures_the_configured_step_or_none(compose, step, measured):
    """trainer.memory_by_category_step picks the step MemoryByCategory measures; 0 adds none."""
    from lightning_dist.callbacks.memory import MemoryByCategory
    from lightning_dist.run.build import run_callbacks
    from lightning_dist.run.plan import plan_run

    plan = plan_run(
        compose(
            "model=llama_debug",
            "data=synthetic",
            "strategy=single",
            f"trainer.memory_by_category_step={step}",
        )
    )
    callbacks = run_callbacks(plan, RunStats(tokens_per_step=1))
    assert [c.step for c in callbacks if isinstance(c, MemoryByCategory)] == measured
