"""The planner's memory against what train.py measures, on the cheapest layouts of the
calibration table (docs/PLANNER.md; the whole table is bench/planner_accuracy.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_dist.calibration import CHEAP, TOLERANCES, compare
from lightning_dist.parallel.memory import StepMemoryMeter, measure_step


@pytest.mark.slow
@pytest.mark.parametrize("name", CHEAP)
def test_prediction_matches_measurement(name, tmp_path):
    result = compare(name, workdir=tmp_path)
    # Sanity of the measurement itself: the peak holds the model states and the activations.
    assert result.measured["total"] >= result.measured["model states"] > 0
    assert result.measured["activations"] > 0.4 * result.measured["total"]
    for category, tolerance in TOLERANCES.items():
        assert abs(result.error(category)) <= tolerance, result.failures()


def test_meter_without_module_hooks_measures_microbatches():
    """A pipeline stage runs its module once per microbatch before any backward, which torch's
    MemTracker refuses with its module hooks; without them the step is still measured."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 4))
    opt = torch.optim.AdamW(model.parameters())
    micro = [torch.randn(64, 32) for _ in range(2)]

    def step():
        opt.zero_grad()
        losses = [model(x).square().mean() for x in micro]  # both forwards, then backward
        sum(losses).backward()
        opt.step()

    step()
    with pytest.raises(NotImplementedError, match="multiple iterative calls"):
        measure_step(step, model, [opt])
    meter = StepMemoryMeter(module_hooks=False)
    meter.start(model, [opt])
    step()
    mem = meter.stop()
    n = sum(p.numel() for p in model.parameters())
    assert (mem["params"], mem["grads"]) == (4 * n, 4 * n)
    # Each microbatch keeps at least the 64 x 256 hidden layer's output for backward.
    assert mem["activations"] >= 2 * 64 * 256 * 4
    assert mem["total"] >= 3 * 4 * n + mem["activations"]
