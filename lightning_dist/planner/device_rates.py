"""Published device measurements the time model reads: flash attention's speed by sequence
length, head dim and masking, matmul speed by shape, the share of memory bandwidth pointwise
kernels reach, the datasheet power each GPU's peak is quoted at and the clock a lower power
limit leaves.

**Attention.** FlashAttention-2's forward + backward speed, TFLOP/s, read off the bars of the
two figures of Dao-AILab/flash-attention's README, `assets/flash2_a100_fwd_bwd_benchmark.png`
(A100 80GB SXM4) and `assets/flash2_h100_fwd_bwd_benchmark.png` (H100 80GB SXM5), both added in
commit 4f285b35 (2023-07-17; the FlashAttention-2 paper, Dao 2023, shows the same benchmark):
head dim 64 and 128, causal or not, sequence 512 to 16k, batch x sequence = 16k tokens, hidden
2048, fp16/bf16. The FLOPs are the benchmark's (`benchmarks/benchmark_flash_attention.py`,
`flops`): a forward of 4 s^2 d per sequence (halved when causal), backward 2.5 x forward. Two
bars of the A100 figure (b, non-causal, head dim 128, at 512 and 1k; and a, head dim 64, at 1k)
are hidden behind the legend and are left out (None) rather than guessed. FlashAttention-3
(Hopper only, its repository's `hopper/` kernels) ran in none of the calibration's runs
(llm-foundry 2023 and torchtitan 2024 ran FlashAttention-2 kernels), so its figures are not
used.

Beyond 16k the rate is held at 16k's (it is saturating: +1% to +7% from 8k to 16k); between
lengths and head dims it is interpolated in log2. A device is read off the H100 table when it
has float8 matmuls (Hopper and later) and off the A100 table otherwise, as a fraction of the
measured card's bf16 peak (A100 312, H100 989 TFLOP/s).

**Power.** `DATASHEET_POWER_W`: the power at which each peak is quoted (H100 SXM and H200 SXM
"up to 700 W", A100 SXM 400 W, RTX 4090 450 W, their datasheets). How the clock falls under a
lower power limit: `A100_BF16_CLOCK_ENERGY`, Perseus's measured profile of one GPT-3 175B
pipeline stage in bf16 on an A100 SXM (Chung et al., "Reducing Energy Bloat in Large Model
Training", SOSP 2024; ml-energy/zeus commit 38cb3f90,
`sosp24_data/emulation/stage_profile/gpt3-175b+a100_sxm_bf16.csv`, stage 0): the forward and the
backward of one microbatch at each locked SM clock from 1410 (the A100's boost clock, at which
its 312 TFLOP/s are quoted) down to 855 MHz by 15, each with its time and energy; kept here
summed over forward and backward (time to 0.01 ms, energy to 0.1 J). Their ratio is the draw at
that clock. A power limit makes the GPU run at the highest clock whose draw fits, so the clock a
limit leaves is read off that curve (`sustained_clock_share`), with the draw at the top clock
standing for the datasheet power (478 W, above the A100 SXM's 400 W: that card's limit was set
higher, so shares are carried, not watts). The same directory's BLOOM stage
(`bloom+a100_sxm_bf16.csv`) draws the same shares within 1.5 points at 1200, 1050 and 900 MHz.
The curve is no power law: the top three clocks draw the same (flat above 1380 MHz); from 80% of
the top draw down to 60% the clock goes as about the 0.5 power of the draw (least squares from
the top down to 60%: 0.52; the CMOS f V^2 with V ~ f would give 1/3); below 1065 MHz (59%) the
draw hardly falls (238 W at 855 MHz, 50%). H100 and H200 take the same shares of their 700 W (no
bf16 sweep of a Hopper part was found: the H100/H200 power-capping study we found, Ujeniya et
al. 2026, measures fp64 DGEMM), as does every GPU whose datasheet power is known.

**Matmul shapes.** `H100_BF16_GEMM_TFLOPS`: OpenXLA's matmul performance table for sm_90
(`xla/service/gpu/model/matmul_interpolator_data.h`, `kDefaultMatmulPTable`, key "sm_90", as
re-measured in openxla/xla commit 71feeddf, 2025-10-21, and unchanged at e97611c4, 2026-02-13):
bf16 x bf16 -> bf16 dots of batch 1, every M, N and K of 256 to 4096, each the median CUPTI
kernel time of five runs (`xla/tools/matmul_perf_table_gen.cc`), stored as FLOP/s and kept here
in TFLOP/s to 0.1. The table names no part; 780 TFLOP/s at 4096^3 is above the H100 PCIe's 756
TFLOP/s peak, so an SXM one (989). No A100 table was found (XLA keeps none; NVIDIA's "Matrix
Multiplication Background" guide plots its A100 shapes without numbers); the A100 takes the
H100's constants, its penalty scaled as below. XLA's newer `default_matmul_perf_table.txtpb`
(same folder) holds the keys "sm_100_B200", "sm_90" and "gfx942" at openxla/xla commit 336bb15c,
and "gfx950" too at 8b82b7bc: no sm_80 (at 336bb15c its sm_90 bf16 points of batch 1 equal the
125 below, to 0.1).

A dot's time is its FLOPs at the large-shape rate times the product over its three dimensions
of x / (x + GEMM_HALF_DIM) (tiles and waves a small dimension leaves idle), plus
GEMM_KERNEL_SECONDS per kernel (pipeline fill and drain: 256^3 takes 5 us at any rate). The
two are least squares of log TFLOP/s over the table's 125 points with the large-shape rate
held at the peak (`fit_gemm_shape`): free, it would settle above the peak. Without the
per-kernel time the product alone fits the table only with a large-shape rate over five times
the peak (GEMM_HALF_DIM near 1800), so both terms are taken.

Other devices scale GEMM_HALF_DIM by their matmul rate over their memory bandwidth
(`gemm_half_dim`). Read to first order, the product over x / (x + h) is 1 / (1 + h (1/M + 1/N
+ 1/K)): the FLOPs' time plus h / rate x (1/M + 1/N + 1/K) x 2 MNK = (h / rate) x 2 (MK + KN
+ MN) seconds, and 2 (MK + KN + MN) is the bf16 bytes of the two operands and the result. So
the penalty is those bytes over rate / h bytes/s: 6.3 TB/s for the table's part (989 TFLOP/s
over h = 156.5), about half (0.53) of their time at its 3.35 TB/s. Keeping that share, h =
GEMM_HALF_DIM x (rate / bandwidth) / (989 TFLOP/s / 3.35 TB/s), where the rate is the one the
time model runs large matmuls at (peak x `matmul_efficiency` x the sustained clock). Two
consequences, the reasons for this form over the bare peak: the penalty's seconds do not depend
on the fitted efficiency (an H100 at efficiency 0.49 pays the table's extra seconds; scaled by
the peak, it would pay twice them), and a device that moves more bytes per FLOP pays a smaller
share of its time for a small dimension (an A100, 312 TFLOP/s over 2.0 TB/s: more seconds than
an H100 for the same bytes, a smaller share of its slower matmul). The bytes are bf16's: fp32
operands would want twice the h, which is not modelled (the GPU plans are bf16). float8
matmuls keep the bf16 h (twice the rate, half the bytes). This scaling is a model, not a
measurement of an A100: no A100 table was found. Its form was chosen on the
leave-one-source-out check, which therefore does not test that choice independently
(docs/PLANNER.md, "The time model").
"""

from __future__ import annotations

import functools
import math

SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
MEASURED_PEAK_TFLOPS = {"a100": 312.0, "h100": 989.0}
FLASH2_FWD_BWD_TFLOPS: dict[tuple[str, int, bool], tuple[float | None, ...]] = {
    # (device, head_dim, causal): TFLOP/s at SEQ_LENS
    ("a100", 64, False): (132, None, 162, 171, 175, 176),
    ("a100", 128, False): (None, None, 187, 196, 201, 203),
    ("a100", 64, True): (88, 119, 140, 156, 165, 171),
    ("a100", 128, True): (99, 133, 155, 173, 182, 189),
    ("h100", 64, False): (215, 254, 274, 288, 294, 296),
    ("h100", 128, False): (248, 294, 320, 326, 335, 338),
    ("h100", 64, True): (141, 192, 232, 257, 273, 284),
    ("h100", 128, True): (163, 221, 265, 294, 308, 328),
}
"""FlashAttention-2 forward + backward TFLOP/s (see the module docstring for the source)."""
FLASH2_FWD_BWD_FLOPS_PER_FORWARD = 3.5
"""The benchmark's forward + backward FLOPs over forward FLOPs (backward 2.5 x forward)."""

ACHIEVABLE_MEMORY_BANDWIDTH_SHARE = 0.92
"""The share of its datasheet memory bandwidth a pointwise kernel achieves on large tensors:
torchao's roofline model (`torchao/testing/training/roofline_utils.py`, `gpu_name_to_specs`,
"NVIDIA H100" `pct_achievable_mem_bw`, in torchao 0.18.0: "pointwise triton kernels with
large inputs", about 2.2 of Meta's H100's 2.4 TB/s). Taken for every GPU (the same file copies
it to the parts it has not measured) and for eager kernels too, which read and write whole
tensors like those."""
A100_BF16_CLOCK_ENERGY: tuple[tuple[int, float, float], ...] = (
    # (locked SM clock MHz, forward + backward seconds, forward + backward joules)
    # (see the module docstring for the source)
    (1410, 0.14312, 68.4),
    (1395, 0.14328, 68.3),
    (1380, 0.14345, 68.5),
    (1365, 0.14391, 67.0),
    (1350, 0.14459, 65.9),
    (1335, 0.14570, 65.5),
    (1320, 0.14687, 64.0),
    (1305, 0.14797, 63.4),
    (1290, 0.14954, 61.8),
    (1275, 0.15078, 60.2),
    (1260, 0.15236, 59.0),
    (1245, 0.15393, 57.9),
    (1230, 0.15558, 56.9),
    (1215, 0.15723, 55.8),
    (1200, 0.15903, 55.2),
    (1185, 0.16081, 54.3),
    (1170, 0.16268, 53.3),
    (1155, 0.16464, 53.1),
    (1140, 0.16671, 52.5),
    (1125, 0.16844, 51.8),
    (1110, 0.17049, 51.1),
    (1095, 0.17273, 50.7),
    (1080, 0.17513, 49.9),
    (1065, 0.17716, 50.0),
    (1050, 0.17958, 50.2),
    (1035, 0.18209, 50.3),
    (1020, 0.18470, 50.3),
    (1005, 0.18740, 50.9),
    (990, 0.19013, 50.6),
    (975, 0.19300, 50.9),
    (960, 0.19542, 51.1),
    (945, 0.19899, 50.8),
    (930, 0.20155, 51.0),
    (915, 0.20423, 51.0),
    (900, 0.20698, 51.1),
    (885, 0.21229, 51.3),
    (870, 0.21525, 51.4),
    (855, 0.21830, 51.9),
)
"""Perseus's A100 SXM bf16 GPT-3 stage profile by SM clock (see the module docstring)."""
DATASHEET_POWER_W = {989.0: 700.0, 312.0: 400.0, 165.2: 450.0}
"""Datasheet power (W) of the GPU whose bf16 peak (TFLOP/s) is the key: H100 SXM and H200 SXM
(989, up to 700 W), A100 SXM (312, 400 W), RTX 4090 (165.2, 450 W)."""


GEMM_DIMS = (256, 512, 1024, 2048, 4096)
H100_BF16_GEMM_TFLOPS: dict[tuple[int, int], tuple[float, ...]] = {
    # (M, N): TFLOP/s at K in GEMM_DIMS (see the module docstring for the source)
    (256, 256): (6.7, 11.5, 18.9, 31.9, 90.9),
    (256, 512): (12.4, 23.0, 41.1, 63.9, 93.1),
    (256, 1024): (23.7, 43.8, 75.1, 119.6, 177.1),
    (256, 2048): (43.8, 83.1, 141.6, 222.6, 296.3),
    (256, 4096): (82.6, 146.2, 237.6, 345.9, 418.4),
    (512, 256): (12.3, 23.0, 41.5, 61.7, 92.8),
    (512, 512): (23.6, 43.6, 73.4, 116.3, 187.5),
    (512, 1024): (45.7, 85.4, 146.5, 231.0, 300.9),
    (512, 2048): (84.5, 147.5, 241.8, 342.8, 460.4),
    (512, 4096): (141.3, 243.6, 381.3, 530.0, 661.6),
    (1024, 256): (23.6, 43.7, 69.8, 116.1, 187.2),
    (1024, 512): (45.5, 84.3, 144.0, 235.5, 312.1),
    (1024, 1024): (80.9, 149.1, 252.8, 359.8, 472.6),
    (1024, 2048): (144.3, 244.0, 384.0, 529.5, 665.7),
    (1024, 4096): (219.7, 347.7, 494.4, 639.1, 751.9),
    (2048, 256): (45.3, 79.0, 142.8, 231.4, 333.9),
    (2048, 512): (84.3, 150.1, 257.6, 354.1, 458.1),
    (2048, 1024): (145.6, 244.9, 386.8, 535.3, 663.6),
    (2048, 2048): (219.7, 348.6, 498.0, 641.0, 752.2),
    (2048, 4096): (303.3, 449.3, 596.5, 725.5, 752.3),
    (4096, 256): (84.5, 144.9, 229.0, 314.3, 398.9),
    (4096, 512): (141.9, 240.1, 377.5, 531.0, 662.0),
    (4096, 1024): (223.0, 354.6, 497.6, 643.7, 751.7),
    (4096, 2048): (308.2, 449.6, 604.6, 727.5, 759.4),
    (4096, 4096): (398.6, 551.8, 685.2, 735.6, 780.2),
}
"""OpenXLA's measured H100 bf16 matmul rates (see the module docstring for the source)."""
GEMM_HALF_DIM = 156.5
"""A matmul dimension of this size runs at half the large-shape rate: `fit_gemm_shape` over
H100_BF16_GEMM_TFLOPS (its minimum, to 0.5)."""
GEMM_KERNEL_SECONDS = 5.62e-6
"""What each matmul kernel takes beyond its FLOPs at the shaped rate: `fit_gemm_shape` over
H100_BF16_GEMM_TFLOPS (its minimum, to 0.01 us)."""


GEMM_TABLE_BANDWIDTH_GBYTES_PER_SEC = 3350.0
"""The memory bandwidth of the part OpenXLA's table was measured on: an H100 SXM (its
datasheet: 3.35 TB/s), whose bf16 peak (989 TFLOP/s) the fit holds as the large-shape rate."""


def gemm_half_dim(matmul_flops_per_sec: float, bandwidth_bytes_per_sec: float) -> float:
    """GEMM_HALF_DIM for a device whose large matmuls run at `matmul_flops_per_sec` and whose
    memory moves `bandwidth_bytes_per_sec`: scaled by that ratio over the table's part's (989
    TFLOP/s over 3.35 TB/s), so that to first order the shape penalty stays the same share
    (about half) of the time of the product's operand and result bytes over the bandwidth
    (module docstring)."""
    table_ratio = MEASURED_PEAK_TFLOPS["h100"] * 1e12 / (GEMM_TABLE_BANDWIDTH_GBYTES_PER_SEC * 1e9)
    return GEMM_HALF_DIM * matmul_flops_per_sec / bandwidth_bytes_per_sec / table_ratio


def gemm_shape_factor(m: float, n: float, k: float, half_dim: float) -> float:
    """The share of the large-shape rate an (m x k) @ (k x n) product reaches, kernel time
    aside: the product over its dimensions of x / (x + half_dim). `half_dim` has no default:
    a device's is `gemm_half_dim`'s, the table's part's GEMM_HALF_DIM."""
    return (m / (m + half_dim)) * (n / (n + half_dim)) * (k / (k + half_dim))


def gemm_table_loss(half_dim: float, kernel_seconds: float) -> float:
    """Squared log errors of the shape model (large-shape rate: the H100's peak) against every
    point of H100_BF16_GEMM_TFLOPS."""
    peak = MEASURED_PEAK_TFLOPS["h100"] * 1e12
    total = 0.0
    for (m, n), rates in H100_BF16_GEMM_TFLOPS.items():
        for k, tflops in zip(GEMM_DIMS, rates, strict=True):
            flops = 2.0 * m * n * k
            seconds = flops / (peak * gemm_shape_factor(m, n, k, half_dim)) + kernel_seconds
            total += math.log(flops / seconds / (tflops * 1e12)) ** 2
    return total


def fit_gemm_shape() -> tuple[float, float]:
    """(GEMM_HALF_DIM, GEMM_KERNEL_SECONDS) minimising `gemm_table_loss`: a grid (4 elements by
    0.25 us), then a finer one over two of its steps either side (0.5 by 0.01 us). About 20 s."""
    grid = [(h, 0.25e-6 * t) for h in range(0, 601, 4) for t in range(41)]
    h0, t0 = min(grid, key=lambda p: gemm_table_loss(*p))
    fine = [(h0 - 8 + 0.5 * i, t0 + 1e-8 * (j - 50)) for i in range(33) for j in range(101)]
    return min(fine, key=lambda p: gemm_table_loss(*p))


def _interpolate(xs, ys, x: float) -> float:
    """Linear interpolation in log2(x) over the known (x, y) pairs, held flat outside."""
    known = [(math.log2(a), b) for a, b in zip(xs, ys, strict=True) if b is not None]
    t = math.log2(x)
    if t <= known[0][0]:
        return known[0][1]
    for (x0, y0), (x1, y1) in zip(known, known[1:], strict=False):
        if t <= x1:
            return y0 + (y1 - y0) * (t - x0) / (x1 - x0)
    return known[-1][1]


@functools.lru_cache(maxsize=256)  # the search asks for a few (length, head dim) pairs, often
def flash_attention_share(seq_len: float, head_dim: float, causal: bool, hopper: bool) -> float:
    """FlashAttention-2's measured forward + backward rate as a share of the bf16 peak of the
    card it was measured on, at `seq_len` keys and `head_dim`, causal or not."""
    device = "h100" if hopper else "a100"
    dims = (64, 128)
    rates = [
        _interpolate(SEQ_LENS, FLASH2_FWD_BWD_TFLOPS[(device, hd, causal)], seq_len) for hd in dims
    ]
    rate = _interpolate(dims, rates, head_dim)
    return rate / MEASURED_PEAK_TFLOPS[device]


def clock_power_curve() -> list[tuple[float, float]]:
    """[(draw / draw at the top clock, clock / top clock)] of A100_BF16_CLOCK_ENERGY, from the
    top clock down."""
    top_mhz, top_seconds, top_joules = A100_BF16_CLOCK_ENERGY[0]
    top_watts = top_joules / top_seconds
    return [(j / s / top_watts, mhz / top_mhz) for mhz, s, j in A100_BF16_CLOCK_ENERGY]


def sustained_clock_share(power_w: float | None, peak_tflops: float | None) -> float:
    """The share of its datasheet clock a GPU sustains at the power limit `power_w`: the
    highest measured clock whose draw (as a share of the top clock's) fits in power_w / its
    datasheet power, linear between measured clocks (`clock_power_curve`); at least the lowest
    measured clock, at most 1; 1 when either power is unknown."""
    rated = DATASHEET_POWER_W.get(float(peak_tflops)) if peak_tflops else None
    if power_w is None or rated is None:
        return 1.0
    share = power_w / rated
    curve = clock_power_curve()
    if share >= curve[0][0]:
        return 1.0
    for (p_hi, c_hi), (p_lo, c_lo) in zip(curve, curve[1:], strict=False):
        if p_lo <= share:  # the first (highest) clock that fits; the one above does not
            return c_lo + (c_hi - c_lo) * (share - p_lo) / (p_hi - p_lo)
    return curve[-1][1]
