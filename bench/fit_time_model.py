"""Fit the planner's time-model constants to every published source (the in-sample fit).

    python bench/fit_time_model.py

The fit is `lightning_dist.published.holdout.fit` over every source (torchtitan, Megatron-LM
Table 1, llm-foundry): `hardware.matmul_efficiency` of dgx_h100 and dgx_a100 (each at its
datasheet power; the clock a lower power limit leaves is Perseus's measured A100 profile and the
matmul shape constants come from OpenXLA's GEMM table: planner/device_rates.py). It prints the fit and each row's error; writing
the values back (the hardware files, the corrections) is left to whoever reads them, rounded.
`python -m lightning_dist.calibration_report --refit` runs the same fit and the
leave-one-source-out ones and stores them (planner/holdout_fits.json).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightning_dist.published import holdout  # noqa: E402


def main() -> int:
    start = holdout.stored_constants()
    print(f"start {start}: loss {holdout.loss(start, holdout.SOURCES):.3f}")
    fit = holdout.fit(holdout.SOURCES, start, evaluations=300)
    print(f"fit {fit}: loss {holdout.loss(fit, holdout.SOURCES):.3f}")
    for source in holdout.SOURCES:
        errors = holdout.relative_errors(fit, source)
        print(f"{source}:", ", ".join(f"{label} {e:+.1%}" for label, e, _ in errors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
