"""The planner's memory calibration without a train.py run: the configured checkpointing and
compile reach the planner's settings, the memory meter measures a pipeline stage's microbatches,
compiled blocks run eager under it (so the table has no compiled row), and the stored calibration
file (lightning_dist/planner/calibration.json) holds every layout and category of the table
(docs/PLANNER.md) with the planner's current predictions, within the tolerances, and the CPU
reserve; malformed rows and files are refused by name. (The runs that measure train.py are
tests/dist/test_planner_accuracy_dist.py.)"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from torch import nn

from lightning_dist.measure.step_memory import StepMemoryMeter, measure_step
from lightning_dist.planner import calibration, calibration_errors
from lightning_dist.run.calibrate import (
    CATEGORIES,
    COMMON,
    LAYOUTS,
    QUANTITY,
    SOURCE,
    comparisons,
    predict,
    predicted_bytes,
)


@pytest.mark.parametrize(
    ("overrides", "label", "backend"),
    [
        (LAYOUTS["3d 1, AC op"], "op", None),
        (LAYOUTS["3d 1, AC every 2"], "every_2", None),
        (
            (
                "strategy=fsdp",
                "hardware.devices=2",
                "strategy.activation_checkpointing=full",
                "strategy.compile=true",
                "strategy.compile_backend=aot_eager",
            ),
            "full",
            "aot_eager",
        ),
        (("strategy=single", "hardware.devices=1", "strategy.compile=true"), "none", "inductor"),
        (("strategy=ddp", "hardware.devices=2"), "none", None),
    ],
)
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
    args = ModelArgs(
        dim=64, n_layers=2, n_heads=4, vocab_size=128, ffn_hidden_size=128, max_seq_len=64
    )
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


# --- the stored calibration file -------------------------------------------------------------


@pytest.fixture(scope="module")
def stored() -> calibration.Calibration:
    return calibration.load()


def test_the_stored_file_loads_and_holds_every_layout_and_category(stored):
    rows = calibration_errors.select(stored.rows, source=SOURCE)
    assert {(r.layout, r.quantity) for r in rows} == {
        (name, QUANTITY[cat]) for name in LAYOUTS for cat in CATEGORIES
    }
    for r in rows:  # each row says how to reproduce it
        assert r.overrides == (*COMMON, *LAYOUTS[r.layout]), r.describe()
        assert r.predicted is not None and r.origin and r.planner_layout, r.describe()
    # What `save` writes, `load` reads back unchanged (so a refresh diffs by row).
    assert calibration.parse(json.loads(calibration.dumps(stored))) == stored
    assert [c.name for c in comparisons(stored.rows)] == list(LAYOUTS)


def test_the_stored_predictions_are_the_planners_current_ones(stored):
    """Planner-only (no train.py): if the planner changed, the rows' predictions are stale;
    refresh them with `python bench/planner_accuracy.py --stored --repredict --write` (keeps
    the measurements) or measure again (docs/PLANNER.md, "Calibration")."""
    stale = []
    for result in comparisons(calibration_errors.select(stored.rows, source=SOURCE)):
        candidate = predict(list(result.overrides))
        now = predicted_bytes(candidate)
        for cat in CATEGORIES:
            if now[cat] != pytest.approx(result.predicted[cat], rel=1e-9):
                stale.append(
                    f"{result.name} {cat}: stored {result.predicted[cat]:.0f}, "
                    f"planner now {now[cat]:.0f}"
                )
        if candidate.describe() != result.label:
            stale.append(f"{result.name}: stored {result.label!r}, now {candidate.describe()!r}")
    assert not stale, "\n".join(stale)


def test_the_stored_rows_are_within_the_tolerances(stored):
    for result in comparisons(stored.rows):
        assert not result.failures()


def test_the_cpu_reserve_is_the_stored_correction(stored):
    """settings.RESERVE_BYTES["cpu"] is read from the correction fitted to the stored process rows,
    and it lies within what those rows imply (peak RSS - peak of tensors, per layout)."""
    from lightning_dist.planner.settings import RESERVE_BYTES

    reserve = stored.correction("reserve_bytes", "cpu")
    assert RESERVE_BYTES["cpu"] == reserve == calibration.correction("reserve_bytes", "cpu")
    implied = [r.measured["process"] - r.measured["total"] for r in comparisons(stored.rows)]
    assert min(implied) <= reserve <= max(implied), [f"{b / 2**30:.3f}" for b in implied]


def _document(**changes) -> dict:
    """A small valid document (made-up numbers) whose row 1 has `changes` (None removes a
    field)."""
    row = {
        "source": "measured-cpu", "quantity": "memory.total_bytes", "measured": 100,
        "predicted": 90.0, "model": "tiny", "hardware": "cpu", "layout": "ddp 2",
        "overrides": ["strategy=ddp"], "precision": "32-true", "seq_len": 128,
        "global_batch_size": 8, "origin": "bench/planner_accuracy.py", "date": "2026-12-01",
    }  # fmt: skip
    published = {
        **row, "source": "published", "quantity": "time.mfu", "measured": 0.40,
        "predicted": None, "model": "a 405B model", "hardware": "16,384 GPUs",
        "layout": "tp 8 x pp 16 x dp 128", "overrides": [], "precision": "bf16-mixed",
        "seq_len": 8192, "origin": "made-up test data, not a citation", "date": "2024-07-31",
    }  # fmt: skip
    bad = {**row, **{k: v for k, v in changes.items() if v is not None}}
    for k, v in changes.items():
        if v is None:
            bad.pop(k)
    return {"format": calibration.FORMAT, "version": calibration.VERSION, "rows": [published, bad]}


def test_a_valid_document_parses_with_a_published_row():
    cal = calibration.parse(_document())
    assert [r.source for r in cal.rows] == ["published", "measured-cpu"]
    assert cal.rows[0].error is None and cal.rows[1].error == pytest.approx(-0.1)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"measured": "100"}, "field 'measured' must be a positive finite number"),
        ({"measured": 0}, "field 'measured' must be a positive finite number"),
        ({"quantity": "memory.peak"}, "field 'quantity' must be one of memory.model_states_bytes"),
        ({"source": "guessed"}, "field 'source' must be one of measured-cpu"),
        ({"date": "1 Dec 2026"}, "field 'date' must be a date YYYY-MM-DD"),
        ({"overrides": "strategy=ddp"}, "field 'overrides' must be a list of 'key=value'"),
        ({"seq_len": 12.5}, "field 'seq_len' must be null or a positive integer"),
        ({"origin": None}, "field 'origin' is missing"),
        ({"mesured": 1}, "unknown field 'mesured'"),
        ({"quantity": "time.mfu", "measured": 40}, "field 'measured' must be a fraction <= 1"),
    ],
)
def test_a_malformed_row_is_refused_naming_the_row_and_field(changes, message):
    name = "ddp 2" if "layout" not in changes else changes["layout"]
    source = changes.get("source", "measured-cpu")
    quantity = changes.get("quantity", "memory.total_bytes")
    where = f"x.json: row 1 ({source} {name!r} {quantity}): "
    with pytest.raises(ValueError, match="^" + re.escape(where + message)):
        calibration.parse(_document(**changes), "x.json")


def test_a_malformed_file_is_refused(tmp_path):
    doc = _document()
    doc["rows"].append(dict(doc["rows"][1]))
    with pytest.raises(
        ValueError,
        match=r"row 2 \(measured-cpu 'ddp 2' memory.total_bytes\) "
        r"repeats row 1",
    ):
        calibration.parse(doc)
    with pytest.raises(ValueError, match="version 2 is not supported"):
        calibration.parse({**_document(), "version": 2})
    with pytest.raises(ValueError, match="field 'format' must be"):
        calibration.parse({**_document(), "format": "csv"})
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="bad.json: not JSON"):
        calibration.load(tmp_path / "bad.json")


def test_save_select_merge_and_error_summary(tmp_path):
    cal = calibration.parse(_document())
    path = tmp_path / "c.json"
    calibration.save(cal, path)
    assert calibration.load(path) == cal
    published, cpu = cal.rows
    assert calibration_errors.select(cal.rows, source=("published", "measured-gpu")) == [published]
    assert calibration_errors.select(cal.rows, quantity="memory.total_bytes", layout="ddp 2") == [
        cpu
    ]
    with pytest.raises(ValueError, match="'kind' is not a row field"):
        calibration_errors.select(cal.rows, kind="x")
    # A new measurement of the same run replaces its row; a new run is appended.
    again = dataclasses.replace(cpu, measured=80)
    other = dataclasses.replace(cpu, layout="tp 2", predicted=120.0)
    merged = cal.with_rows([other, again])
    assert merged.rows == (published, again, other)
    summary = calibration_errors.error_summary(merged.rows)  # the published row has no prediction
    assert (summary.count, summary.worst) == (2, other)
    assert summary.median == pytest.approx((0.125 + 0.2) / 2) and summary.max == pytest.approx(0.2)
    with pytest.raises(ValueError, match="no row has a prediction"):
        calibration_errors.error_summary([published])
    with pytest.raises(ValueError, match=r"row \(measured-cpu 'ddp 2' .*field 'measured'"):
        dataclasses.replace(cpu, measured=-1)  # a row is checked as it is made
