"""Telemetry: interval arithmetic, MFU and bubble formulas, and a real 2-rank run in which a
slowed rank is named as the straggler, the comm/compute numbers reach summary.json and W&B,
and the report turns the run into PNGs."""

import json

import pytest

from lightning_dist.callbacks.comm import theoretical_bubble
from lightning_dist.callbacks.context import RunContext
from lightning_dist.callbacks.intervals import subtract, union_length, union_of
from lightning_dist.callbacks.throughput import ThroughputMonitor
from lightning_dist.hardware import HardwareSpec
from lightning_dist.layout import Layout
from lightning_dist.models.args import ModelArgs
from lightning_dist.parity import run_train


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
    assert theoretical_bubble(zero_bubble) == 0.0


def test_mfu_uses_palm_flops_and_dense_peak():
    args = ModelArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256,
                     ffn_hidden_size=14336)  # fmt: skip
    h100 = HardwareSpec(name="dgx_h100", accelerator="gpu", devices=8, peak_tflops_bf16=989)
    ctx = RunContext(hardware=h100, layout=Layout(dp_shard=8), precision="bf16-mixed",
                     seq_len=8192, global_batch_size=64,
                     flops_per_token=args.train_flops_per_token(8192))  # fmt: skip
    monitor = ThroughputMonitor()
    monitor.bind(ctx)
    rates = monitor.rates(step_seconds=10.0, world_size=8)
    tokens_per_sec = 64 * 8192 / 10.0
    expected = args.train_flops_per_token(8192) * tokens_per_sec / (989e12 * 8)
    assert rates["tokens_per_sec"] == pytest.approx(tokens_per_sec)
    assert rates["mfu"] == pytest.approx(expected)
    cpu = RunContext(hardware=HardwareSpec(), layout=Layout(), precision="32-true", seq_len=8,
                     global_batch_size=1, flops_per_token=1.0)  # fmt: skip
    assert cpu.mfu(1000.0, 1) is None


@pytest.mark.slow
def test_straggler_comm_and_report_from_a_real_run(tmp_path):
    summary = run_train(
        ["model=llama_debug", "data=synthetic", "strategy=ddp", "logger=wandb",
         "trainer.max_steps=10", "trainer.log_every_n_steps=1", "trainer.val_check_interval=null",
         "callbacks.comm.every_n_steps=5",
         "+callbacks.slow._target_=tests.slow_rank.SlowRank", "+callbacks.slow.seconds=0.2"],
        tmp_path,
    )  # fmt: skip
    stragglers = summary["stragglers"]
    assert stragglers["slowest_rank"] == 1, stragglers
    assert stragglers["spread"] > 1.2  # the default warning threshold
    comm = summary["comm"]
    assert len(comm["per_rank"]) == 2
    for rank in comm["per_rank"]:
        assert rank["comm_seconds"] > 0 and rank["compute_seconds"] > 0
        assert set(rank["comm_seconds_by_dim"]) == {"dp"}
    assert 0 < comm["comm_compute_ratio"] < 10
    assert summary["throughput"]["tokens_per_sec"] > 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("comm/comm_compute_ratio" in r for r in rows)
    (log,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    for key in (b"comm/comm_compute_ratio", b"comm/dp_seconds", b"stragglers/slowest_rank"):
        assert key in log.read_bytes(), key

    from PIL import Image

    from lightning_dist.report import main

    assert main([str(tmp_path)]) == 0
    pngs = sorted((tmp_path / "report").glob("*.png"))
    assert {p.name for p in pngs} >= {"loss.png", "tokens_per_sec.png", "comm_ratio.png",
                                      "memory_per_rank.png"}  # fmt: skip
    for png in pngs:
        with Image.open(png) as image:
            assert image.size[0] > 100 and image.size[1] > 100
    assert "comm/compute" in (tmp_path / "report" / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_measured_bubble_matches_the_schedule(tmp_path, schedule):
    """pp=2, m=4: the measured idle fraction is within 5 points of (p-1)/(m+p-1) = 0.2."""
    summary = run_train(
        # Enough work per microbatch (4 x 512 tokens) that per-action overhead stays small.
        ["model=tiny", "data=synthetic", "data.seq_len=512", "data.global_batch_size=16",
         "logger=none", "trainer.val_check_interval=null", "trainer.max_steps=7",
         "strategy=pp", "strategy.pp=2", f"strategy.schedule={schedule}",
         "strategy.microbatches=4", "callbacks.comm.first_step=3",
         "callbacks.comm.every_n_steps=2"],
        tmp_path,
    )  # fmt: skip
    bubble = summary["bubble"]
    assert bubble["theoretical"] == pytest.approx(0.2)
    assert len(bubble["per_stage"]) == 2 and len(bubble["measured_per_profiled_step"]) == 3
    assert abs(bubble["measured"] - bubble["theoretical"]) < 0.05, bubble


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "dims"),
    [
        (["strategy=fsdp"], {"dp"}),
        (["strategy=3d", "strategy.tp=2", "strategy.pp=2", "hardware.devices=4"], {"tp", "pp"}),
    ],
    ids=["fsdp", "3d"],
)
def test_comm_numbers_reach_summary_and_wandb(tmp_path, overrides, dims):
    summary = run_train(
        ["model=llama_debug", "data=synthetic", "logger=wandb", "trainer.max_steps=4",
         "trainer.log_every_n_steps=1", "trainer.val_check_interval=null", *overrides],
        tmp_path,
    )  # fmt: skip
    comm = summary["comm"]
    assert comm["comm_compute_ratio"] > 0
    for rank in comm["per_rank"]:
        assert dims <= set(rank["comm_seconds_by_dim"]), rank["comm_seconds_by_dim"]
    (log,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    records = log.read_bytes()
    for dim in dims:
        assert f"comm/{dim}_seconds".encode() in records
    assert b"comm/comm_compute_ratio" in records
