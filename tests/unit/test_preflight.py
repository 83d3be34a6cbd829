"""train.py's pre-flight check: plan.only on a machine without GPUs, and a layout predicted
not to fit stops with the numbers and the planner's suggestion."""

from lightning_dist.config import compose_config, hardware_spec, model_spec
from lightning_dist.contract import contract_of
from lightning_dist.layout import Batch, Layout
from lightning_dist.run.preflight import estimate_run


def test_ddp_prediction_is_unsharded(tmp_path):
    cfg = compose_config(["hardware=dgx_h100", "model=llama3_8b", f"paths.output_dir={tmp_path}"])
    layout = Layout(dp_replicate=8)
    assert contract_of(object()).options.planner_sharding(layout) == "NO_SHARD"
    candidate = estimate_run(
        Batch.of_config(cfg.data),
        model_spec(cfg),
        hardware_spec(cfg),
        object(),
        layout,
        "bf16-mixed",
    )
    states = candidate.as_dict()["memory_bytes"]
    model_states = states["params"] + states["grads"] + states["optimizer"]
    assert abs(model_states / (16 * 8.03e9) - 1) < 0.01


def test_plan_only_works_without_gpus(tmp_path, capsys):
    from lightning_dist.train import train

    cfg = compose_config(
        [
            "strategy=fsdp",
            "hardware=dgx_h100",
            "model=llama3_70b",
            "plan.only=true",
            f"paths.output_dir={tmp_path}",
        ]
    )
    result = train(cfg)
    out = capsys.readouterr().out
    assert "plan for strategy=fsdp on dgx_h100" in out
    assert "fits: no" in out and "planner suggests" in out
    assert result == {"plan_only": True, "fits": False}  # train.py exits 1: 70B does not fit


def test_layout_predicted_not_to_fit_stops_before_launch(tmp_path, monkeypatch, capsys):
    from test_bad_inputs import run_in_process

    status, lines = run_in_process(
        ["strategy=ddp", "hardware=dgx_h100", "model=llama3_8b"], tmp_path, monkeypatch, capsys
    )
    errors = [line for line in lines if line.startswith("error:")]
    assert status == 2 and len(errors) == 1, lines
    assert "GiB/device, has 80" in errors[0] and "planner suggests" in errors[0]
    assert "plan.check=false" in errors[0]
