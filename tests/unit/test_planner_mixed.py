"""Mixed hardware in the planner (`lightning_dist/planner/mixed.py`): node groups in rank order,
pipeline stages by speed within each group's memory, and the one-line refusals."""

from __future__ import annotations

import pytest

from lightning_dist.config import compose_config, hardware_spec, model_spec
from lightning_dist.layout import Layout
from lightning_dist.planner.estimate import estimate
from lightning_dist.planner.mixed import rank_groups, speed_split


def _spec(*overrides):
    cfg = compose_config([*overrides, "paths.output_dir=."])
    return cfg, hardware_spec(cfg)


def test_the_groups_map_nodes_in_order_and_give_one_worst_figure():
    _, hw = _spec("hardware=mixed_h100_a100")
    assert (hw.num_nodes, hw.world_size) == (4, 32)
    assert [hw.node_group(n)[0] for n in range(4)] == ["h100", "h100", "a100", "a100"]
    assert hw.peak_tflops_bf16 == pytest.approx((989 + 312) / 2)  # MFU over all devices
    assert hw.peak_tflops_fp8 is None  # the A100s have none
    groups = rank_groups(hw, Layout(pp=4, tp=8))
    assert [g.name for g in groups] == ["dgx_h100", "dgx_h100", "dgx_a100", "dgx_a100"]
    assert rank_groups(hw, Layout(pp=2, tp=2, dp_shard=8)) is not None
    assert rank_groups(hw, Layout(pp=1, dp_shard=32)) is None  # its one rank spans both groups


def test_the_speed_split_gives_the_faster_stage_more_blocks_within_its_cap():
    assert speed_split([1.0] * 8, [3.0, 1.0]) == [6]  # 6 / 3 = 2 = 2 / 1
    assert speed_split([1.0] * 8, [1.0, 1.0]) == [4]
    assert speed_split([1.0] * 8, [3.0, 1.0], caps=[5, 8]) == [5]
    assert speed_split([1.0] * 8, [1.0, 1.0], last=4.0) == [6]  # the output on the last
    with pytest.raises(ValueError, match="holds at most"):
        speed_split([1.0] * 8, [1.0, 1.0], caps=[3, 3])


def test_70b_on_mixed_hardware_puts_more_blocks_on_the_h100_stages():
    cfg, hw = _spec("hardware=mixed_h100_a100", "model=llama3_70b")
    model = model_spec(cfg)
    c = estimate(
        model,
        hw,
        Layout(pp=4, tp=8),
        global_batch_size=64,
        seq_len=4096,
        activation_checkpointing="full",
    )
    points = c.settings.options.pipeline.split_points
    sizes = [b - a for a, b in zip([0, *points], [*points, 80], strict=True)]
    assert sum(sizes) == 80 and min(sizes[:2]) > 2 * max(sizes[2:]), sizes  # ~2.5x the speed
    assert c.fits
    even = estimate(
        model,
        hw,
        Layout(pp=4, tp=8),
        global_batch_size=64,
        seq_len=4096,
        activation_checkpointing="full",
        split_points=[20, 40, 60],
    )
    assert c.time.step_seconds < 0.75 * even.time.step_seconds


def test_a_stage_over_its_groups_memory_gets_fewer_blocks():
    """H100s of 64 GiB beside A100s: by speed alone the H100 stage would take 70B's blocks
    its memory cannot hold at this batch; capped, it keeps fewer and the layout fits."""
    from lightning_dist.hardware import HardwareSpec
    from lightning_dist.planner.estimate import speed_split_points
    from lightning_dist.planner.settings import TrainSettings

    _, h100 = _spec("hardware=dgx_h100")
    _, a100 = _spec("hardware=dgx_a100")
    small = HardwareSpec(**{**vars(h100), "memory_gib": 64, "name": "h100_64g", "num_nodes": 2})
    hw = HardwareSpec(
        name="mix",
        accelerator="gpu",
        num_nodes=4,
        groups={"fast": small, "slow": HardwareSpec(**{**vars(a100), "num_nodes": 2})},
    )
    model = model_spec(compose_config(["model=llama3_70b", "paths.output_dir=."]))
    layout, knobs = Layout(pp=2, tp=8, dp_shard=2), dict(activation_checkpointing="full")
    c = estimate(model, hw, layout, global_batch_size=32, seq_len=4096, **knobs)
    (point,) = c.settings.options.pipeline.split_points
    settings = TrainSettings.of(global_batch_size=32, seq_len=4096, **knobs)
    (by_speed,) = speed_split_points(model, hw, layout.resolve(32), settings)
    too_many = estimate(
        model, hw, layout, global_batch_size=32, seq_len=4096, split_points=[by_speed], **knobs
    )
    assert c.fits and not too_many.fits and point < by_speed, (point, by_speed, c.reason)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["hardware.num_nodes=5"], "hardware.num_nodes=5 but the node groups hold 4 nodes"),
        (["hardware.groups.a100.num_nodes=1"], "hardware.num_nodes=4 but the node groups hold 3"),
        (
            [
                "hardware.groups.h100.num_nodes=1",
                "hardware.groups.a100.num_nodes=3",
                "strategy=3d",
                "strategy.pp=2",
            ],
            "pp=2 puts a pipeline rank on two node groups",
        ),
        (
            ["strategy=3d", "strategy.pp=4", "strategy.float8=tensorwise"],
            "node group a100 (dgx_a100) of mixed_h100_a100 has no float8 matmuls",
        ),
    ],
)
def test_mixed_hardware_refusals_name_the_value(overrides, message):
    from lightning_dist.run.errors import ConfigError
    from lightning_dist.train import train

    cfg = compose_config(
        [
            "hardware=mixed_h100_a100",
            "model=llama3_8b",
            "plan.only=true",
            "data.global_batch_size=64",
            *overrides,
            "paths.output_dir=.",
        ]
    )
    with pytest.raises(
        (ValueError, ConfigError), match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        train(cfg)


def test_without_pp_every_rank_must_fit_the_smallest_groups_memory():
    """H200s beside H100s (the same speed): data parallelism over both is checked against the
    H100s' 80 GiB, not the slowest group's (which was the H200 one, with 141)."""
    from lightning_dist.hardware import HardwareSpec

    _, h100 = _spec("hardware=dgx_h100")
    _, h200 = _spec("hardware=dgx_h200")
    hw = HardwareSpec(
        name="mix",
        accelerator="gpu",
        num_nodes=2,
        groups={
            "h200": HardwareSpec(**{**vars(h200), "num_nodes": 1}),
            "h100": HardwareSpec(**{**vars(h100), "num_nodes": 1}),
        },
    )
    model = model_spec(compose_config(["model=llama3_8b", "paths.output_dir=."]))
    c = estimate(
        model, hw, Layout(dp_shard=16), global_batch_size=32, seq_len=8192, micro_batch_size=2
    )
    assert 80 * 0.9 < c.memory.total / 2**30 < 141 * 0.9
    assert not c.fits and "has 80" in c.reason, c.reason


def test_over_the_30_percent_rule_the_planner_times_less_gradient_traffic():
    """DDP across two sites over a 10 Gb/s VPN: communication dwarfs compute, and the advice
    times bf16 gradients (half the bytes), PowerSGD and DiLoCo (one all-reduce every 8 steps)
    on the same layout; on a node's NVLink there is none."""
    from lightning_dist.planner.advice import slow_link_advice
    from lightning_dist.planner.estimate import evaluate

    _, hw = _spec(
        "hardware=mixed_h100_a100",
        "hardware.site_link_gbytes_per_sec=1.25",
        "hardware.site_link_latency_ms=20",
    )
    model = model_spec(compose_config(["model=llama3_1b", "paths.output_dir=."]))
    c = estimate(
        model, hw, Layout(dp_replicate=32), global_batch_size=64, seq_len=2048, sharding="NO_SHARD"
    )
    lines = slow_link_advice(
        model, hw, c, evaluate=lambda st: evaluate(model, hw, c.layout, st, headroom=0.9)
    )
    assert lines[0].startswith("note: communication is") and c.time.comm_compute_ratio > 1
    gains = {
        line.split(":")[0].strip(): float(line.split("(")[1].split("%")[0]) for line in lines[1:4]
    }
    diloco = (
        "strategy.diloco_inner_steps=8 strategy.diloco_outer_lr=1.0 "
        "strategy.diloco_outer_momentum=0.0"
    )
    assert set(gains) == {
        "strategy.grad_compression=bf16",
        "strategy.grad_compression=powersgd",
        diloco,
    }
    assert 0 < gains["strategy.grad_compression=bf16"] < gains[diloco]
    _, one_node = _spec("hardware=dgx_h100")
    local = estimate(
        model,
        one_node,
        Layout(dp_replicate=8),
        global_batch_size=64,
        seq_len=2048,
        sharding="NO_SHARD",
    )
    assert slow_link_advice(model, one_node, local, evaluate=None) == []
