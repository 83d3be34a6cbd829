"""The planner's memory against what train.py measures, on the cheapest layouts of the
calibration table (docs/PLANNER.md; the whole table is bench/planner_accuracy.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_dist.parallel.memory import StepMemoryMeter, measure_step
from lightning_dist.run.calibrate import CHEAP, COMMON, LAYOUTS, TOLERANCES, compare, predict


@pytest.mark.slow
@pytest.mark.parametrize("name", CHEAP)
def test_prediction_matches_measurement(name, tmp_path):
    result = compare(name, workdir=tmp_path)
    # Sanity of the measurement itself: the peak holds the model states and the activations.
    assert result.measured["total"] >= result.measured["model states"] > 0
    assert result.measured["activations"] > 0.4 * result.measured["total"]
    for category, tolerance in TOLERANCES.items():
        assert abs(result.error(category)) <= tolerance, result.failures()


@pytest.mark.parametrize(
    ("overrides", "label", "backend"),
    [
        (LAYOUTS["3d 1, AC op"], "op", None),
        (LAYOUTS["3d 1, AC every 2"], "every_2", None),
        (("strategy=fsdp", "hardware.devices=2", "strategy.activation_checkpointing=full",
          "strategy.compile=true", "strategy.compile_backend=aot_eager"), "full", "aot_eager"),
        (("strategy=single", "hardware.devices=1", "strategy.compile=true"), "none", "inductor"),
        (("strategy=ddp", "hardware.devices=2"), "none", None),
    ],
)  # fmt: skip
def test_the_configured_checkpointing_and_compile_reach_the_planner(overrides, label, backend):
    """train.py's strategy config -> the planner's settings, as `plan.check` estimates a run."""
    settings = predict([*COMMON, *overrides]).settings
    assert settings.activation_checkpointing.label == label
    assert (settings.compile_backend if settings.compile else None) == backend


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


def test_compiled_blocks_run_eager_under_the_memory_meter():
    """Why the calibration table has no compiled row (docs/PLANNER.md): under MemTracker's
    dispatch mode torch.compile falls back to eager, so `measure_step` would measure the eager
    step. If this fails, compiled memory has become measurable: add a compiled row."""
    from lightning_dist.models.args import ModelArgs

    calls = []

    def counting_backend(graph, example_inputs):
        def run(*args):
            calls.append(1)
            return graph.forward(*args)

        return run

    torch.manual_seed(0)
    args = ModelArgs(dim=64, n_layers=2, n_heads=4, vocab_size=128, ffn_hidden_size=128,
                     max_seq_len=64)  # fmt: skip
    model = args.build()
    for block in model.layers.values():
        block.compile(backend=counting_backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.randint(0, 128, (2, 32))

    def step():
        opt.zero_grad()
        model(tokens).float().pow(2).mean().backward()
        opt.step()

    step()
    calls.clear()
    step()
    assert len(calls) == 2  # one compiled forward per block
    calls.clear()
    measure_step(step, model, [opt])
    assert calls == []
