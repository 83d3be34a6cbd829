"""The time model's published device physics: FlashAttention-2's measured rate by sequence
length, head dim and masking, the matmul shape constants taken from OpenXLA's H100 GEMM table,
the clock a power limit leaves, and the memory bandwidth pointwise kernels reach
(planner/device_rates.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from omegaconf import OmegaConf

from lightning_dist.config import CONF_DIR
from lightning_dist.hardware import HardwareSpec
from lightning_dist.models.args import ModelArgs
from lightning_dist.planner.compute import POINTWISE_SCALE, microbatch_compute
from lightning_dist.planner.device_rates import (
    A100_BF16_CLOCK_ENERGY,
    GEMM_HALF_DIM,
    GEMM_KERNEL_SECONDS,
    H100_BF16_GEMM_TFLOPS,
    flash_attention_share,
    gemm_half_dim,
    gemm_shape_factor,
    gemm_table_loss,
    sustained_clock_share,
)
from lightning_dist.planner.settings import TrainSettings


def _hardware(name: str) -> HardwareSpec:
    return HardwareSpec(
        **OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hardware" / f"{name}.yaml"))
    )


def test_attention_rate_is_the_figures_bar_between_and_held_past_16k():
    # H100, causal, head dim 128: 308 TFLOP/s at 8k, 328 at 16k (flash2_h100_fwd_bwd_benchmark.png)
    assert flash_attention_share(8192, 128, True, hopper=True) == pytest.approx(308 / 989)
    assert flash_attention_share(32768, 128, True, True) == pytest.approx(328 / 989)
    between = flash_attention_share(8192 * math.sqrt(2), 128, True, True)
    assert between == pytest.approx((308 + 328) / 2 / 989)
    # A100, causal, head dim 64 vs 128 at 2k: 140 and 155; head dim 96 half-way in log2 terms
    assert flash_attention_share(2048, 64, True, False) == pytest.approx(140 / 312)
    assert flash_attention_share(2048, 96, True, False) == pytest.approx(
        (140 + (155 - 140) * math.log2(1.5)) / 312
    )
    # a bar hidden behind the figure's legend is not guessed: the next measured one is used
    assert flash_attention_share(512, 128, False, False) == pytest.approx(187 / 312)
    assert flash_attention_share(4096, 128, False, True) > flash_attention_share(
        4096, 128, True, True
    )


def test_the_gemm_shape_constants_are_the_published_tables_least_squares():
    """GEMM_HALF_DIM and GEMM_KERNEL_SECONDS are the minimum of the fit to OpenXLA's table
    (`fit_gemm_shape`, 20 s, run once to store them): a step either way in either costs more."""
    best = gemm_table_loss(GEMM_HALF_DIM, GEMM_KERNEL_SECONDS)
    for dh, dt in ((0.5, 0), (-0.5, 0), (0, 1e-8), (0, -1e-8)):
        assert gemm_table_loss(GEMM_HALF_DIM + dh, GEMM_KERNEL_SECONDS + dt) > best
    assert len(H100_BF16_GEMM_TFLOPS) * 5 == 125
    # The model against two of the table's points: 2048^3 at 641 TFLOP/s, 4096^3 at 780.
    for size, tflops in ((2048, 641.0), (4096, 780.2)):
        flops = 2.0 * size**3
        seconds = (
            flops / (989e12 * gemm_shape_factor(size, size, size, GEMM_HALF_DIM))
            + GEMM_KERNEL_SECONDS
        )
        assert flops / seconds / 1e12 == pytest.approx(tflops, rel=0.15)


def test_the_shape_penalty_follows_the_devices_flops_per_byte():
    """The table's part (989 TFLOP/s over 3.35 TB/s) pays GEMM_HALF_DIM; half the bandwidth
    doubles it, half the rate halves it. The shipped devices' values are the ones
    docs/PLANNER.md quotes, and an A100 pays a smaller share for a 96-wide head than the
    table's H100; dgx_h100 pays the table's extra seconds to first order, whatever its
    efficiency (h / rate is the table's)."""
    assert gemm_half_dim(989e12, 3350e9) == pytest.approx(GEMM_HALF_DIM)
    assert gemm_half_dim(989e12, 1675e9) == pytest.approx(2 * GEMM_HALF_DIM)
    assert gemm_half_dim(494.5e12, 3350e9) == pytest.approx(GEMM_HALF_DIM / 2)
    half = {}
    for name in ("dgx_a100", "dgx_h100", "dgx_h200"):
        spec = _hardware(name)
        clock = sustained_clock_share(spec.power_w, spec.peak_tflops_bf16)
        rate = spec.peak_tflops_bf16 * 1e12 * spec.matmul_efficiency * clock
        half[name] = gemm_half_dim(rate, spec.memory_gbytes_per_sec * 1e9)
        if name == "dgx_h100":
            assert half[name] / rate == pytest.approx(GEMM_HALF_DIM / 989e12)
    assert {k: round(v) for k, v in half.items()} == {
        "dgx_a100": 54,
        "dgx_h100": 77,
        "dgx_h200": 54,
    }
    factor = gemm_shape_factor(2048, 2048, 96, half["dgx_a100"])
    assert factor > 1.5 * gemm_shape_factor(2048, 2048, 96, GEMM_HALF_DIM)


def test_a_power_cap_leaves_the_clock_whose_measured_draw_fits():
    """Perseus's A100 profile: the top clock (1410 MHz) draws 478 W; a limit at a measured
    clock's share of that draw leaves that clock, one between two clocks a clock between them,
    one below the lowest measured draw (238 W at 855 MHz) the lowest clock."""
    top_mhz, seconds, joules = A100_BF16_CLOCK_ENERGY[0]
    assert joules / seconds == pytest.approx(478, abs=0.5)
    assert sustained_clock_share(700, 989) == sustained_clock_share(400, 312) == 1.0
    assert sustained_clock_share(800, 989) == 1.0  # no faster than the datasheet clock
    assert sustained_clock_share(None, 989) == sustained_clock_share(300, 42.0) == 1.0
    for mhz, s, j in A100_BF16_CLOCK_ENERGY[3:]:  # the three top clocks draw the same
        watts = 400 * (j / s) / (joules / seconds)
        assert sustained_clock_share(watts, 312) == pytest.approx(mhz / top_mhz, abs=0.011)
    assert 1185 / 1410 < sustained_clock_share(500, 989) < 1200 / 1410  # torchtitan's H100s
    assert sustained_clock_share(100, 989) == 855 / 1410


def test_a_power_cap_lowers_every_compute_rate_by_the_sustained_clock():
    model = ModelArgs(
        dim=4096, n_layers=2, n_heads=32, n_kv_heads=8, vocab_size=1000, ffn_hidden_size=14336
    )
    full = _hardware("dgx_h100")
    capped = replace(full, power_w=500)
    assert full.power_w == 700 and _hardware("dgx_a100").power_w == 400
    kwargs = dict(
        tp=1,
        layers=2,
        has_output=False,
        checkpointed=0,
        mode="none",
        tokens=8192,
        seq_len=8192,
        peak=989e12,
        compiled=True,
        sequence_parallel=False,
        attention="flash",
    )
    slow = microbatch_compute(model, capped, **kwargs).seconds
    fast = microbatch_compute(model, full, **kwargs).seconds
    clock = sustained_clock_share(500, 989)
    assert fast < slow < fast / clock  # the memory-bound pointwise term does not slow down
    longer = microbatch_compute(model, full, **{**kwargs, "seq_len": 32768}).seconds
    assert longer > fast  # each token attends over four times the keys
    with pytest.raises(ValueError, match="hardware.power_w=0"):
        replace(full, power_w=0)


def test_pointwise_traffic_is_the_run_s_block_code_at_torchao_s_bandwidth_share():
    """MPT's block (bf16 LayerNorm, GELU, no RoPE: compute.POINTWISE_BYTES["mpt"]) moves less
    than ours; either moves at 0.92 of the datasheet bandwidth (torchao's figure)."""
    assert POINTWISE_SCALE == pytest.approx(1 / 0.92)
    model = ModelArgs(dim=4096, n_layers=2, n_heads=32, vocab_size=1000, ffn_hidden_size=10944)
    kwargs = dict(
        tp=1,
        layers=2,
        has_output=False,
        checkpointed=0,
        mode="none",
        tokens=4096,
        seq_len=2048,
        peak=312e12,
        compiled=False,
        sequence_parallel=False,
        attention="flash",
    )
    a100 = _hardware("dgx_a100")
    llama = microbatch_compute(model, a100, **kwargs).seconds
    mpt = microbatch_compute(model, a100, block_ops="mpt", **kwargs).seconds
    free = microbatch_compute(model, replace(a100, memory_gbytes_per_sec=1e12), **kwargs).seconds
    assert free < mpt < llama
    with pytest.raises(ValueError, match="block_ops='gpt' is not one of llama, mpt"):
        TrainSettings(global_batch_size=1, seq_len=8, block_ops="gpt")
