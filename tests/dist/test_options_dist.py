"""A strategy's options reach `parallelize()` whole: the 3d preset built from config with op-level
checkpointing and compile, applied to the debug model on a gloo process group of one, wraps every
block in a CheckpointWrapper and compiles. (That every knob is settable from each preset and
reaches the strategy and the planner is tests/unit/test_options.py.)"""

from __future__ import annotations

from lightning_dist.config import compose_config, hardware_spec, model_spec
from lightning_dist.run.plan import build_strategy

# knob: (override value as typed, the parsed value the strategy keeps, context overrides)

BASE = ["model=llama3_8b", "hardware=dgx_h100", "data.global_batch_size=32", "data.seq_len=2048"]


def _strategy(tmp_path, name: str, extra: list[str]):
    cfg = compose_config([*BASE, f"strategy={name}", *extra, f"paths.output_dir={tmp_path}"])
    hw = hardware_spec(cfg)
    return cfg, hw, build_strategy(cfg.strategy, hw)


def test_parallelize_reads_the_options_the_strategy_built(tmp_path):
    """One process, a mesh of one: the strategy's options go to `parallelize()` whole, and the
    checkpointing and compile knobs it applies at any world size take effect."""
    import torch
    import torch.distributed as dist

    from lightning_dist.parallel.parallelize import parallelize

    _, _, strategy = _strategy(
        tmp_path,
        "3d",
        [
            "strategy.activation_checkpointing=op",
            "strategy.compile=true",
            "strategy.compile_backend=eager",
        ],
    )
    cfg = compose_config(["model=llama_debug", f"paths.output_dir={tmp_path}"])
    model = model_spec(cfg).build()
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        layout = strategy.options.layout.resolve(1)
        result = parallelize(
            model,
            layout.build_mesh("cpu"),
            layout,
            device=torch.device("cpu"),
            options=strategy.options,
        )
    finally:
        dist.destroy_process_group()
    wrapped = [m for m in result.modules() if type(m).__name__ == "CheckpointWrapper"]
    assert len(wrapped) == model_spec(cfg).n_layers
    assert any(getattr(m, "_compiled_call_impl", None) is not None for m in result.modules())
