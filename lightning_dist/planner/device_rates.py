"""Published device measurements the time model reads: flash attention's speed by sequence
length, head dim and masking, the share of memory bandwidth pointwise kernels reach, and the
datasheet power each GPU's peak is quoted at.

**Attention.** FlashAttention-2's forward + backward speed, TFLOP/s, read off the bars of the
two figures of Dao-AILab/flash-attention's README, `assets/flash2_a100_fwd_bwd_benchmark.png`
(A100 80GB SXM4) and `assets/flash2_h100_fwd_bwd_benchmark.png` (H100 80GB SXM5), both added in
commit 4f285b35 (2023-07-17; the FlashAttention-2 paper, Dao 2023, shows the same benchmark):
head dim 64 and 128, causal or not, sequence 512 to 16k, batch x sequence = 16k tokens, hidden
2048, fp16/bf16. The FLOPs are the benchmark's (`benchmarks/benchmark_flash_attention.py`, `flops`): a forward
of 4 s^2 d per sequence (halved when causal), backward 2.5 x forward. Two bars of the A100
figure (b, non-causal, head dim 128, at 512 and 1k; and a, head dim 64, at 1k) are hidden
behind the legend and are left out (None) rather than guessed. FlashAttention-3 (Hopper only,
its repository's `hopper/` kernels) ran in none of the calibration's runs (llm-foundry 2023 and
torchtitan 2024 ran FlashAttention-2 kernels), so its figures are not used.

Beyond 16k the rate is held at 16k's (it is saturating: +1% to +7% from 8k to 16k); between
lengths and head dims it is interpolated in log2. A device is read off the H100 table when it
has float8 matmuls (Hopper and later) and off the A100 table otherwise, as a fraction of the
measured card's bf16 peak (A100 312, H100 989 TFLOP/s).

**Power.** `DATASHEET_POWER_W`: the power at which each peak is quoted (H100 SXM and H200 SXM
"up to 700 W", A100 SXM 400 W, RTX 4090 450 W, their datasheets). How the sustained clock falls
under a lower cap is not published as numbers we could find for bf16 matmuls (NVIDIA's
datasheets give the TDP and the boost clock the peak is quoted at, 1830 MHz for the H100 SXM's
989 TFLOP/s, not clock versus power limit; the power-capping study we found, Ujeniya et al.
2026 on H100/H200, measures fp64 DGEMM): the planner takes dynamic CMOS power ~ f V^2 with
V ~ f (clock ~ power^exponent, 1/3 as the starting value) and fits the exponent
(calibration.json `clock_power_exponent`), which the leave-one-source-out check exposes.
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
CLOCK_POWER_PRIOR = 1 / 3
"""The exponent dynamic CMOS power ~ f V^2 with V ~ f gives: the fit's start, and its value
where no run below its datasheet power is fitted (published.holdout.CONSTRAINED_ONLY_BY)."""
DATASHEET_POWER_W = {989.0: 700.0, 312.0: 400.0, 165.2: 450.0}
"""Datasheet power (W) of the GPU whose bf16 peak (TFLOP/s) is the key: H100 SXM and H200 SXM
(989, up to 700 W), A100 SXM (312, 400 W), RTX 4090 (165.2, 450 W)."""


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


def sustained_clock_share(
    power_w: float | None, peak_tflops: float | None, exponent: float
) -> float:
    """The share of its datasheet clock a GPU sustains at the power limit `power_w`:
    (power_w / datasheet power) ** exponent, at most 1; 1 when either power is unknown."""
    rated = DATASHEET_POWER_W.get(float(peak_tflops)) if peak_tflops else None
    if power_w is None or rated is None:
        return 1.0
    return min(1.0, (power_w / rated) ** exponent)
