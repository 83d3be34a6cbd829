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
    candidate = estimate_run(Batch.of_config(cfg.data), model_spec(cfg), hardware_spec(cfg), object(), layout,
                             "bf16-mixed")  # fmt: skip
    states = candidate.as_dict()["memory_bytes"]
    model_states = states["params"] + states["grads"] + states["optimizer"]
    assert abs(model_states / (16 * 8.03e9) - 1) < 0.01
