"""Expert parallelism (`strategy.ep`) and a mixture of experts under tensor and pipeline
parallelism, in real gloo processes on the ranks of started worlds (tests/dist/world.py;
docs/MOE.md, "Expert parallelism").

- Training through `train(cfg)`: model=moe_debug, 10 steps, fp32, both balancing methods on,
  against one process's stored reference (`moe_debug_lr1e-2`): ep2 on 2 ranks, and ep2 x
  dp_shard4, ep2 x tp2 and ep2 x pp2 on 4; every step's loss and both validation losses
  within 1e-4 relative.
- A chain of layouts at the library level (tests/dist/expert_parallel_cases.py), moe_debug with
  a dense first block: in each, one forward and backward against one device's, every
  parameter's gradient. The losses alone would miss a wrong gradient scale (Adam is blind to
  it: with the experts' gradients halved, ep2 still trained within 2.1e-4 of the reference,
  measured), so each layout's gradients must match to 1e-5 (relative norm): ep1, ep2 and ep4
  (FSDP groups of one rank) over dp_shard 4, HSDP with ep2, ep2 x tp2, ep2 x pp2 with activation
  checkpointing; the expert weights' bytes per rank at ep1 and ep2. Then each loads the
  checkpoint of the one before (the first: one device's) and saves its own: weights and
  optimizer state bitwise, and one process reads each whole, the experts under the
  single-process names.
- A user's own LightningModule under `Trainer(strategy=Parallel3DStrategy(ep=2))`, and an ep
  rank that receives no rows at all.
"""

from __future__ import annotations

import time

import baselines
import pytest

from lightning_dist.run.parity_runs import max_relative_difference

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4
BASE = [
    "model=moe_debug", "data=synthetic", "logger=none", "trainer.max_steps=10",
    "trainer.val_check_interval=5", "data.num_samples=8", "optim.lr=1e-2",
    "optim.warmup_steps=1", *baselines.QUIET,
]  # fmt: skip
CASES = {  # name: (overrides, the layout summary.json must show)
    "ep2": (["strategy=3d", "strategy.ep=2", "hardware.devices=2"], {"dp_shard": 2, "ep": 2}),
    # Experts over 2 ranks, FSDP over the other 2.
    "ep2_dp4": (["strategy=3d", "strategy.ep=2", "hardware.devices=4"], {"dp_shard": 4, "ep": 2}),
    "ep2_tp2": (
        ["strategy=3d", "strategy.ep=2", "strategy.tp=2", "hardware.devices=4"],
        {"dp_shard": 2, "tp": 2, "ep": 2},
    ),
    "ep2_pp2": (
        ["strategy=3d", "strategy.ep=2", "strategy.pp=2", "hardware.devices=4"],
        {"dp_shard": 2, "pp": 2, "ep": 2},
    ),
}  # fmt: skip


def test_expert_parallel_layouts_match_one_process(train_in, tmp_path_factory):
    reference = baselines.reference([*BASE, "strategy=single", "hardware.devices=1"])
    failures = []
    for name, (overrides, degrees) in CASES.items():
        started = time.perf_counter()
        summary = train_in([*BASE, *overrides, "report=false"], tmp_path_factory.mktemp(name))
        seconds = time.perf_counter() - started
        diff = max_relative_difference(reference["losses"], summary["losses"])
        val_diff = max_relative_difference(reference["val_losses"], summary["val_losses"])
        print(f"PARITY {name}: train {diff:.3e}, val {val_diff:.3e}, {seconds:.1f} s")
        layout = {k: summary["layout"].get(k) for k in degrees}
        if layout != degrees:
            failures.append((name, summary["layout"]))
        if len(summary["losses"]) != 10 or diff > TOLERANCE or val_diff > TOLERANCE:
            failures.append((name, diff, val_diff, summary["losses"]))
        # The aux loss is in the objective and its own metric, under every layout.
        if not all(a and a > 0 for a in summary["moe"]["aux_losses"]):
            failures.append((name, summary["moe"]["aux_losses"]))
    assert not failures, failures


LAYOUTS = {  # 3d knobs, in the order of the checkpoint chain (each loads the one before)
    "ep1_dp4": {"dp_shard": 4},
    "ep2_dp4": {"dp_shard": 4, "ep": 2},
    "ep4_dp4": {"dp_shard": 4, "ep": 4},  # each expert's FSDP group is one rank
    "hsdp2x2_ep2": {"dp_replicate": 2, "dp_shard": 2, "ep": 2},
    "ep2_tp2": {"dp_shard": 2, "tp": 2, "ep": 2},  # sequence parallelism on (auto)
    "ep2_pp2_ac": {"dp_shard": 2, "pp": 2, "ep": 2, "activation_checkpointing": 1},
}
CHANGES = {"first_k_dense": 1}
"""A dense first block: its MLP is replicated over tp like the MoE layers, and sits beside
them in a pipeline stage."""


@pytest.fixture(scope="module")
def chain(worlds, tmp_path_factory):
    """The library-level chain of LAYOUTS on the world of 4 (expert_parallel_cases.py)."""
    started = time.perf_counter()
    result = worlds(4).run(
        "expert_parallel_cases:layout_chain",
        str(tmp_path_factory.mktemp("chain")),
        LAYOUTS,
        CHANGES,
    )
    print(f"layout chain: {time.perf_counter() - started:.1f} s")
    return result


def test_every_gradient_matches_one_device_and_ep_halves_the_gathered_experts(chain):
    failures = []
    for name in LAYOUTS:
        (lm, ref_lm), (aux, ref_aux) = chain[0]["cases"][name]["lm"], chain[0]["cases"][name]["aux"]
        worst = max(rank["cases"][name]["worst_grad"] for rank in chain)
        print(
            f"GRADIENTS {name}: lm {abs(lm / ref_lm - 1):.1e}, aux {abs(aux / ref_aux - 1):.1e}, "
            f"worst gradient {worst[0]:.1e} ({worst[1]})"
        )
        if abs(lm / ref_lm - 1) > 1e-5 or abs(aux / ref_aux - 1) > 1e-5 or worst[0] > 1e-5:
            failures.append((name, lm, ref_lm, aux, ref_aux, worst))
        result = chain[0]["cases"][name]
        if result["params_checked"] != result["params"]:
            failures.append((name, "params", result["params_checked"], result["params"]))
    one, two = chain[0]["cases"]["ep1_dp4"], chain[0]["cases"]["ep2_dp4"]
    print(
        f"EXPERT BYTES per rank, dp_shard=4: at rest (3 MoE layers, {one['expert_bytes_total']} "
        f"in the model) ep1 {one['expert_bytes_at_rest']}, ep2 {two['expert_bytes_at_rest']}; "
        f"gathered while one layer computes ep1 {one['expert_bytes_computing']}, ep2 "
        f"{two['expert_bytes_computing']}"
    )
    # FSDP shards every expert over dp_shard either way: the same shards at rest; what ep
    # changes is what a layer gathers to compute: its E / ep experts instead of all E.
    assert one["expert_bytes_at_rest"] == two["expert_bytes_at_rest"]
    assert one["expert_bytes_at_rest"] * 4 == one["expert_bytes_total"]
    assert two["expert_bytes_computing"] * 2 == one["expert_bytes_computing"] > 0
    assert not failures, failures


def test_checkpoints_reshard_between_ep_and_other_layouts(chain):
    """One device -> each layout of LAYOUTS in turn, each loading the checkpoint before it, and
    each one's checkpoint read whole by one process: weights and optimizer state bitwise."""
    links = chain[0]["links"]
    print(f"CHECKPOINTS {links}")
    assert len(links) == 2 * len(LAYOUTS)
    for link, (compared, bad) in links.items():
        assert compared > 50 and not bad, (link, bad)  # weights, moments, steps (of a stage)
    shapes = chain[0]["expert_shapes"]  # whole, under the single-process names
    assert len(shapes) == 3 * 3  # w1, w2, w3 of blocks 1 to 3
    assert shapes["state_dict.model.layers.1.feed_forward.experts.w1"] == [4, 64, 64]
    assert shapes["state_dict.model.layers.3.feed_forward.experts.w2"] == [4, 64, 64]


def test_a_users_lightning_module_trains_under_expert_parallelism(worlds):
    started = time.perf_counter()
    result = worlds(2).run("expert_parallel_cases:user_module_case", 3)[0]
    diff = max_relative_difference(result["reference"], result["losses"])
    print(
        f"USER MODULE ep2: {diff:.2e}, {time.perf_counter() - started:.1f} s, "
        f"{result['expert_placements']}"
    )
    assert len(result["losses"]) == 3 and diff < 1e-5
    assert result["expert_placements"] == ["(Shard(dim=1), Shard(dim=0))"]  # FSDP x ep


def test_a_rank_that_receives_no_rows(worlds):
    """Routing biased away from the second rank's experts: it receives (and sends back) no
    rows, and every gradient is still one device's."""
    results = worlds(2).run("expert_parallel_cases:empty_rank_case")
    print(
        f"EMPTY RANK: rows per layer {[r['rows'] for r in results]}, "
        f"worst gradient {max(r['worst_grad'] for r in results)}"
    )
    assert results[1]["rows"] == [0] * 4 and all(n > 0 for n in results[0]["rows"])
    assert max(r["worst_grad"][0] for r in results) < 1e-5
