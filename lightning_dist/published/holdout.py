"""Leave-one-source-out: the time model's fitted constants refitted without one source of
published runs, then used to predict that source (`python -m lightning_dist.calibration_report`
prints the result beside each row's error; `--refit` recomputes the fits).

The sources are torchtitan's Llama 3.1 8B H100 rows, Megatron-LM's Table 1 and llm-foundry's
MPT rows (`published/foundry.py`). The constants fitted: `matmul_efficiency` of dgx_h100 and
dgx_a100 (each at its datasheet power). The clock a lower power limit leaves (Perseus's
measured A100 clock-versus-draw profile), the matmul shape constants (OpenXLA's H100 GEMM
table; each device's half dim then moves with its fitted efficiency,
`device_rates.gemm_half_dim`), flash attention's rates (the kernel paper's figures) and the memory bandwidth
pointwise kernels reach (torchao's) are published measurements (planner/device_rates.py), not
fitted. The loss is the sum of squared errors over each row's target plus three times the
worst one squared, minimised by Nelder-Mead from two starts (the stored values and a neutral
one; the lowest loss is kept, so a left-out fit may end where the start fitted with every
source led). The fits live in planner/holdout_fits.json with the band of the plan's
predictions (`prediction_band`); memory rows depend on none of these constants, so their
leave-one-source-out error is their error.
"""

from __future__ import annotations

import json
from dataclasses import astuple, dataclass, replace
from pathlib import Path

HOLDOUT_PATH = Path(__file__).resolve().parents[1] / "planner" / "holdout_fits.json"
SOURCES = ("torchtitan", "megatron", "llm-foundry")
BAND_PERCENTILES = (10, 90)


@dataclass(frozen=True)
class TimeConstants:
    """The fitted constants of the GPU time model."""

    h100_efficiency: float
    a100_efficiency: float


def source_of(origin: str) -> str:
    """The source a published row's `origin` cites."""
    if "llm-foundry" in origin:
        return "llm-foundry"
    return "torchtitan" if "torchtitan" in origin else "megatron"


def stored_constants() -> TimeConstants:
    """The constants the planner runs with (conf/hardware and calibration.json)."""
    from lightning_dist.published.runs import hardware

    h100, a100 = (_efficiency(hardware([f"hardware={n}"])) for n in ("dgx_h100", "dgx_a100"))
    return TimeConstants(h100, a100)


def _efficiency(spec) -> float:
    if spec.matmul_efficiency is None:
        raise ValueError(f"hardware {spec.name} has no matmul_efficiency to fit")
    return spec.matmul_efficiency


def relative_errors(constants: TimeConstants, source: str) -> list:
    """[(row label, predicted / published - 1, target)] of one source's time rows under
    `constants` (torchtitan's float8 rows included: they are fitted like the others)."""
    from lightning_dist.planner import megatron
    from lightning_dist.published import foundry
    from lightning_dist.published import runs as report

    out = []
    if source == "torchtitan":
        for run in report.TORCHTITAN_RUNS:
            spec = replace(
                report.torchtitan_hardware(run.gpus // 8),
                matmul_efficiency=constants.h100_efficiency,
            )
            c = report.torchtitan_candidate(run, spec)
            out.append(
                (
                    report.torchtitan_label(run),
                    c.time.tokens_per_sec / run.gpus / run.tokens_per_gpu - 1,
                    0.15,
                )
            )
    elif source == "megatron":
        node = replace(
            report.hardware(["hardware=dgx_a100"]), matmul_efficiency=constants.a100_efficiency
        )
        for row in megatron.TABLE1:
            result = megatron.compare_row(row, node, rank=False)
            points = result["paper_percent"] - row.percent_of_peak
            out.append(
                (
                    f"GPT {row.billions:g}B",
                    points / row.percent_of_peak,
                    5 / row.percent_of_peak,
                )
            )
    else:
        for mpt in foundry.FOUNDRY_RUNS:
            spec = report.hardware(foundry.foundry_hardware_overrides(mpt))
            eff = constants.h100_efficiency if "h100" in spec.name else constants.a100_efficiency
            c = foundry.foundry_candidate(mpt, replace(spec, matmul_efficiency=eff))
            out.append((mpt.label, c.time.tokens_per_sec / mpt.gpus / mpt.tokens_per_gpu - 1, 0.15))
    return out


def loss(constants: TimeConstants, sources: tuple[str, ...]) -> float:
    """The fit's loss over `sources`' time rows: squared errors over each row's target, plus
    three times the worst one squared."""
    low = (0.2, 0.2)
    high = (1.0, 1.0)
    if not all(a < x <= b for a, x, b in zip(low, astuple(constants), high, strict=True)):
        return 1e9
    scaled = [e / t for s in sources for _, e, t in relative_errors(constants, s)]
    return sum(v * v for v in scaled) + 3 * max(abs(v) for v in scaled) ** 2


def nelder_mead(f, start: list[float], steps: list[float], evaluations: int = 120) -> list[float]:
    """Minimise `f` from `start` (the textbook simplex: reflect, expand, contract, shrink)."""
    simplex = [list(start)] + [
        [x + (s if i == j else 0.0) for j, x in enumerate(start)] for i, s in enumerate(steps)
    ]
    values = [f(p) for p in simplex]
    calls = len(simplex)
    while calls < evaluations:
        order = sorted(range(len(simplex)), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centre = [sum(p[j] for p in simplex[:-1]) / (len(simplex) - 1) for j in range(len(start))]
        worst = simplex[-1]

        def toward(t: float, worst=worst, centre=centre) -> list[float]:
            return [c + t * (c - w) for c, w in zip(centre, worst, strict=True)]

        reflected = toward(1.0)
        r = f(reflected)
        calls += 1
        if r < values[0]:
            expanded = toward(2.0)
            e = f(expanded)
            calls += 1
            simplex[-1], values[-1] = (expanded, e) if e < r else (reflected, r)
        elif r < values[-2]:
            simplex[-1], values[-1] = reflected, r
        else:
            contracted = toward(-0.5)
            c = f(contracted)
            calls += 1
            if c < values[-1]:
                simplex[-1], values[-1] = contracted, c
            else:  # shrink toward the best
                best = simplex[0]
                simplex = [best] + [
                    [b + 0.5 * (x - b) for b, x in zip(best, p, strict=True)] for p in simplex[1:]
                ]
                values = [values[0]] + [f(p) for p in simplex[1:]]
                calls += len(simplex) - 1
    return simplex[min(range(len(simplex)), key=values.__getitem__)]


def fit(sources: tuple[str, ...], start: TimeConstants, evaluations: int = 120) -> TimeConstants:
    """The constants that minimise `loss` over `sources`, from `start`."""
    x = list(astuple(start))
    steps = [0.05, 0.05]
    best = nelder_mead(lambda p: loss(TimeConstants(*p), sources), x, steps, evaluations)
    return TimeConstants(*best)


def best_fit(sources: tuple[str, ...], evaluations: int = 300) -> TimeConstants:
    """`fit` from the stored constants and from a neutral start (both efficiencies at 0.5): the
    lowest loss."""
    starts = [stored_constants(), TimeConstants(0.5, 0.5)]
    fits = [fit(sources, start, evaluations) for start in starts]
    return min(fits, key=lambda c: loss(c, sources))


def refit(evaluations: int = 300) -> dict:
    """Fit once per left-out source, and once on every source ("all": the in-sample fit), each
    the best of several starts (`best_fit`); the stored JSON form (see `load_fits`)."""
    fits = {"all": best_fit(SOURCES, evaluations)}
    for left_out in SOURCES:
        kept = tuple(s for s in SOURCES if s != left_out)
        fits[left_out] = best_fit(kept, evaluations)
    errors = [e for s in SOURCES for _, e, _ in relative_errors(fits[s], s)]
    return {
        "fits": {s: vars(c) for s, c in fits.items()},
        "band": band(errors),
        "evaluations": evaluations,
    }


def holdout_report(fits: dict) -> tuple[str, list[str]]:
    """A markdown table of every published time row: its error as shipped, in-sample (the
    "all" fit) and leave-one-source-out, against its target; and the lines of the rows whose
    leave-one-source-out error misses. Time rows only: the constants move no memory row."""
    lines = [
        "| source | row | as shipped | in-sample | leave-one-source-out | target |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    shipped = stored_constants()
    misses = []
    for source in SOURCES:
        now = relative_errors(shipped, source)
        inside = relative_errors(fits["all"], source)
        held = relative_errors(fits[source], source)
        for (label, e0, target), (_, e1, _), (_, e2, _) in zip(now, inside, held, strict=True):
            met = abs(e2) <= target + 1e-9
            shown = [f"{e:+.1%}" for e in (e0, e1, e2)]
            lines.append(
                f"| {source} | {label} | {' | '.join(shown)} | {target:.0%} "
                f"{'met' if met else 'MISSED'} |"
            )
            if not met:
                misses.append(f"{source} {label}: {e2:+.1%}")
    return "\n".join(lines), misses


def band(errors: list[float]) -> list[float]:
    """The BAND_PERCENTILES of `errors` (linear interpolation between ranks)."""
    ordered = sorted(errors)
    out = []
    for p in BAND_PERCENTILES:
        k = (len(ordered) - 1) * p / 100
        lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
        out.append(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo))
    return out


def save_fits(data: dict, path: Path = HOLDOUT_PATH) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


def load_fits(path: Path = HOLDOUT_PATH) -> dict:
    """{"fits": {source or "all": TimeConstants}, "band": [p10, p90], "evaluations": n}."""
    data = json.loads(path.read_text())
    data["fits"] = {s: TimeConstants(**v) for s, v in data["fits"].items()}
    return data


def prediction_band(tokens_per_sec: float, path: Path = HOLDOUT_PATH) -> tuple[float, float]:
    """(low, high) tokens/s for a prediction: the prediction corrected by the 90th and the 10th
    percentile of the leave-one-source-out errors (an error e means predicted = (1 + e) x
    published, so the run likely does prediction / (1 + e))."""
    p10, p90 = json.loads(path.read_text())["band"]
    return tokens_per_sec / (1 + p90), tokens_per_sec / (1 + p10)
