"""The dry run (lightning_dist/measure/fake_rank.py): ranks of an 8-rank world built by the real
`parallelize()` on torch's fake process group with fake tensors, one optimizer step each,
against the planner's model-state bytes and traffic by mesh dimension for each rank's stage.
No gloo world: each rank runs in a forked process of its own, as `plan.dry_run` runs them."""

from __future__ import annotations

from functools import partial

import pytest
from omegaconf import OmegaConf

from lightning_dist.config import CONF_DIR
from lightning_dist.hardware import HardwareSpec
from lightning_dist.layout import Layout
from lightning_dist.measure.collective_counter import Traffic
from lightning_dist.measure.fake_rank import dry_run_rank, each_in_a_fresh_process
from lightning_dist.models.args import ModelArgs, MoEArgs
from lightning_dist.options import PRESETS
from lightning_dist.planner import estimate
from lightning_dist.planner.memory import model_state_bytes
from lightning_dist.planner.stage_shapes import stage_shapes
from lightning_dist.planner.traffic import ring_volume, traffic_by_dim
from lightning_dist.run.dry_run import NEGLIGIBLE_BYTES, dry_run_ranks, options_on_device


def _yaml(group: str, name: str) -> dict:
    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{name}.yaml"))
    return {k: v for k, v in raw.items() if k not in ("defaults", "_target_")}


DEBUG = ModelArgs(**_yaml("model", "llama_debug"))
MOE_DEBUG = MoEArgs(**_yaml("model", "moe_debug"))  # routed as a balanced router would
H100 = HardwareSpec(**_yaml("hardware", "dgx_h100"))  # 8 devices: the world of every case
CASES = {
    # name: (layout knobs, global batch, per-rank micro-batch or None[, model: DEBUG])
    "hsdp 2x4, 2 micro-steps": ({"dp_replicate": 2, "dp_shard": 4}, 16, 1),
    "tp2 + SP x fsdp4": ({"tp": 2, "dp_shard": 4}, 8, None),
    # float8 linears whose weights FSDP gathers in float8 (one byte each; planner/traffic.py)
    "fsdp8 float8 all-gather": (
        {"dp_shard": 8, "float8": "tensorwise", "float8_all_gather": True},
        8,
        None,
    ),
    "pp2 1F1B x tp2 x fsdp2": ({"pp": 2, "tp": 2, "dp_shard": 2, "microbatches": 4}, 8, None),
    "pp2 Interleaved1F1B v2 x fsdp4": (
        {
            "pp": 2,
            "dp_shard": 4,
            "schedule": "Interleaved1F1B",
            "virtual_stages": 2,
            "microbatches": 4,
        },
        16,
        None,
    ),
    "cp2 all-gather x tp2 + SP x fsdp2": ({"cp": 2, "tp": 2, "dp_shard": 2}, 8, None),
    "ep4 x fsdp8, experts": ({"ep": 4, "dp_shard": 8}, 8, None, MOE_DEBUG),
    # ZeRO-1: 1/4 of the optimizer states, the gradients' reduce-scatter and the parameters'
    # all-gather over dp_replicate (no all-reduce: it would add half their bytes again)
    "zero1 dp_replicate4 x tp2": (
        {"dp_replicate": 4, "dp_shard": 1, "tp": 2, "shard_optimizer": True},
        8,
        None,
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_each_rank_holds_and_sends_what_the_planner_predicts(name):
    knobs, global_batch, micro, *rest = CASES[name]
    model = rest[0] if rest else DEBUG
    options = options_on_device(PRESETS["3d"].build(knobs, "dry run"), "bf16-mixed", "gpu")
    layout = options.declared_layout(1).resolve(H100.world_size)
    cand = estimate(
        model,
        H100,
        layout,
        global_batch_size=global_batch,
        seq_len=64,
        precision="bf16-mixed",
        micro_batch_size=micro,
        options=options,
    )
    layout, settings = cand.layout, cand.settings
    shapes = [s for _, s in stage_shapes(model, layout)]
    steps = cand.grad_accumulation // (layout.num_microbatches if layout.pp > 1 else 1)
    run = partial(
        dry_run_rank,
        model.build,
        layout,
        options=options,
        precision="bf16-mixed",
        micro_batch_size=settings.micro_batch_size,
        seq_len=64,
        accumulate=steps,
        ring_volume=ring_volume,
    )
    for got in each_in_a_fresh_process(run, dry_run_ranks(layout)):
        rank = got.rank
        shape = shapes[got.coordinate["pp"]]
        params, grads, optimizer, _ = model_state_bytes(layout, settings, shape)
        assert got.param_bytes == pytest.approx(params, rel=0.02), (name, rank)
        assert got.grad_bytes == pytest.approx(grads, rel=0.02), (name, rank)
        assert got.optimizer_bytes == pytest.approx(optimizer, rel=0.02), (name, rank)
        want = traffic_by_dim(model, layout, settings, shape)
        assert want, "every case moves data over some dimension"
        for dim, volume in want.items():
            assert got.traffic.volume.get(dim, 0.0) == pytest.approx(volume, rel=0.05), (
                name,
                rank,
                dim,
                got.traffic.volume,
            )
        unpredicted = {d: v for d, v in got.traffic.volume.items() if d not in want}
        assert all(v < NEGLIGIBLE_BYTES for v in unpredicted.values()), unpredicted
        assert got.micro_steps_run == min(steps, 2)


def test_pipeline_ranks_and_accumulated_traffic():
    layout = Layout(pp=4, dp_shard=2, tp=2).resolve(16)
    assert dry_run_ranks(layout) == [0, 4, 12]
    assert dry_run_ranks(Layout(dp_shard=8).resolve(8)) == [0]
    first, later = Traffic(), Traffic()
    first.add("dp_shard", 10.0)
    later.add("dp_shard", 4.0, calls=3)
    later.add("tp", 1.0)
    total = first.combined(later, 3)
    assert total.volume == {"dp_shard": 22.0, "tp": 3.0}
    assert total.calls == {"dp_shard": 10, "tp": 3}


def test_a_schedule_with_split_backward_is_named():
    options = PRESETS["3d"].build(
        {"pp": 2, "dp_shard": 4, "schedule": "ZBVZeroBubble", "virtual_stages": 2}, "dry run"
    )
    layout = options.declared_layout(1).resolve(8)
    with pytest.raises(ValueError, match="schedule=ZBVZeroBubble"):  # before any group starts
        dry_run_rank(
            DEBUG.build,
            layout,
            0,
            options=options,
            precision="bf16-mixed",
            micro_batch_size=1,
            seq_len=64,
            accumulate=1,
            ring_volume=ring_volume,
        )
