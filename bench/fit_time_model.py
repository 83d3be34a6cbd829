"""Fit the planner's time-model constants to the published rows (lightning_dist/calibration_report.py).

    python bench/fit_time_model.py

Free: `hardware.matmul_efficiency` of dgx_h100 and dgx_a100, and the corrections
`gemm_half_dim`, `attention_share` and `pointwise_scale` of planner/calibration.json. The loss
is the sum of squared errors over each row's target (torchtitan tokens/s: 15%; Megatron-LM
percent of peak: 5 points) plus three times the worst one squared; Nelder-Mead (scipy) from the
values stored now. It prints the fit and each row's error; writing the values back (the two
hardware files, the three corrections) is left to whoever reads them, rounded.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lightning_dist.planner.compute as compute  # noqa: E402
from lightning_dist import calibration_report as report  # noqa: E402
from lightning_dist.planner import megatron  # noqa: E402

H100 = {r.gpus: report.torchtitan_hardware(r.gpus // 8) for r in report.TORCHTITAN_RUNS}
A100 = report.hardware(["hardware=dgx_a100"])
BF16_RUNS = [run for run in report.TORCHTITAN_RUNS if not run.float8]
"""The rows the constants are fitted to; the float8 rows check the float8 terms unfitted."""


def errors(x) -> tuple[list[float], list[float]]:
    """(torchtitan relative errors, Megatron errors in points) for parameters `x`."""
    h100, a100, half, attention, pointwise = x
    compute.GEMM_HALF_DIM, compute.ATTENTION_SHARE, compute.POINTWISE_SCALE = (
        half, attention, pointwise
    )  # fmt: skip
    report.torchtitan_hardware = lambda n: replace(H100[8 * n], matmul_efficiency=h100)
    titan = [
        report.torchtitan_candidate(run).time.tokens_per_sec / run.gpus / run.tokens_per_gpu - 1
        for run in BF16_RUNS
    ]
    node = replace(A100, matmul_efficiency=a100)
    mega = [
        megatron.compare_row(row, node)["paper_percent"] - row.percent_of_peak
        for row in megatron.TABLE1
    ]
    return titan, mega


def loss(x) -> float:
    h100, a100, half, attention, pointwise = x
    if not (0.2 < h100 <= 1 and 0.2 < a100 <= 1 and 1 < half < 4096 and 0.1 < attention <= 1.5
            and 0.05 < pointwise < 5):  # fmt: skip
        return 1e9
    titan, mega = errors(x)
    scaled = [e / 0.15 for e in titan] + [g / 5 for g in mega]
    return sum(v * v for v in scaled) + 3 * max(abs(v) for v in scaled) ** 2


def main() -> int:
    from scipy.optimize import minimize

    start = [H100[8].matmul_efficiency, A100.matmul_efficiency, compute.GEMM_HALF_DIM,
             compute.ATTENTION_SHARE, compute.POINTWISE_SCALE]  # fmt: skip
    print(f"start {start}: loss {loss(start):.3f}")
    fit = minimize(loss, start, method="Nelder-Mead", options={"maxfev": 300, "xatol": 1e-3})
    names = ("dgx_h100 matmul_efficiency", "dgx_a100 matmul_efficiency", "gemm_half_dim",
             "attention_share", "pointwise_scale")  # fmt: skip
    for name, value in zip(names, fit.x, strict=True):
        print(f"{name}: {value:.4g}")
    titan, mega = errors(fit.x)
    print("torchtitan tokens/s errors:", ", ".join(f"{e:+.1%}" for e in titan))
    print("Megatron % of peak errors:", ", ".join(f"{g:+.1f}" for g in mega))
    return 0


if __name__ == "__main__":
    sys.exit(main())
