"""The mesh runtime (lightning_dist/mesh/) under a plain PyTorch loop, no Lightning: the loop of
examples/mesh_runtime_loop.py, run layout after layout inside the ranks of worlds started once
(tests/dist/world.py), trains the same 10 losses as the Trainer path within 1e-6 relative.

The Trainer path is the stored single-process reference `llama_debug_val5`
(tests/dist/baselines.py; every parity case of tests/dist/test_parallel3d_dist.py holds its
multi-rank Trainer runs to it), and the loop takes every setting from the same composed config
(model, data, seed, optimizer, schedule, clipping), so no Trainer runs here. Measured on the
machine that wrote it: 1.5e-7 relative (9.5e-7 absolute) for each layout, and 0.0 against the
Trainer path of the same layout (tp2 and fsdp2, trained through `train(cfg)` beside it). A
checkpoint the runtime writes under pp2 loads, resharded, into tp2 with the same weights; the
Trainer refuses to resume it (it holds no loop state) in one line naming `trainer.init_from`.
"""

from __future__ import annotations

import dataclasses
import time

import baselines
import pytest

from lightning_dist.run.parity_runs import max_relative_difference

pytestmark = pytest.mark.slow

TOLERANCE = 1e-6
REFERENCE = "llama_debug_val5"
TWO_RANKS = {  # name: the strategy knobs of a preset, as `Trainer(strategy=...)` takes them
    "ddp_like": {"preset": "3d", "dp_replicate": 2},  # replicas, each a whole copy
    # ZeRO-1: the replicas' optimizer states sharded (parallel/sharded_optimizer.py)
    "ddp_like_zero1": {"preset": "3d", "dp_replicate": 2, "shard_optimizer": True},
    "fsdp2": {"preset": "fsdp2", "dp_replicate": 1},
    "tp2": {"preset": "3d", "tp": 2},  # sequence and loss parallelism on (the defaults)
    "pp2": {"preset": "3d", "pp": 2},  # 1F1B over 4 microbatches
}
FOUR_RANKS = {
    "dp2xcp2": {"preset": "3d", "cp": 2},
    "dp2xtp2_zero1": {"preset": "3d", "tp": 2, "dp_replicate": 2, "shard_optimizer": True},
    # (dp2 x pp2 ZeRO-1: train.py's parity case and resume, tests/dist/test_parallel3d_dist.py)
}
ADAM_STATES = 2
"""AdamW's per-element states (exp_avg, exp_avg_sq), fp32 here."""


def loop_settings(overrides: list[str]) -> tuple[dict, dict]:
    """(the model's fields, the loop's settings) of `train.py OVERRIDES`' composed config."""
    from omegaconf import OmegaConf

    from lightning_dist.config import compose_config, model_spec

    cfg = compose_config([*overrides, "paths.output_dir=unused"])
    data, optim = cfg.data, cfg.optim
    settings = {
        "steps": cfg.trainer.max_steps, "seed": cfg.seed, "seq_len": data.seq_len,
        "global_batch_size": data.global_batch_size, "micro_batch_size": data.micro_batch_size,
        "num_samples": data.num_samples, "lr": optim.lr, "min_lr_ratio": optim.min_lr_ratio,
        "warmup_steps": optim.warmup_steps, "weight_decay": optim.weight_decay,
        "betas": tuple(OmegaConf.to_object(optim.betas)), "eps": optim.eps,
        "max_norm": cfg.trainer.gradient_clip_val,
    }  # fmt: skip
    return dataclasses.asdict(model_spec(cfg)), settings


def test_a_plain_loop_over_the_runtime_trains_the_trainer_losses(worlds, tmp_path):
    reference = baselines.stored()[REFERENCE]
    model, settings = loop_settings(reference["overrides"])
    started = time.perf_counter()
    runs = {
        **worlds(2).run("mesh_runtime_cases:plain_loop_losses", model, settings, TWO_RANKS)[0],
        **worlds(4).run("mesh_runtime_cases:plain_loop_losses", model, settings, FOUR_RANKS)[0],
    }
    seconds = time.perf_counter() - started
    for name, run in runs.items():
        diff = max_relative_difference(reference["losses"], run["losses"])
        absolute = max(abs(a - b) for a, b in zip(reference["losses"], run["losses"], strict=True))
        print(f"RUNTIME {name} {run['layout']}: {diff:.2e} relative, {absolute:.2e} absolute")
        assert diff <= TOLERANCE, (name, reference["losses"], run["losses"])
    print(f"RUNTIME {len(runs)} layouts in {seconds:.0f}s")
    assert runs["dp2xcp2"]["layout"]["cp"] == 2 and runs["pp2"]["layout"]["pp"] == 2
    assert runs["ddp_like"]["layout"]["dp_replicate"] == 2
    # ZeRO-1's optimizer states: ceil(N / dp) elements per state and group on each rank
    # (N: the group's local elements), 1/dp of the unsharded optimizer's up to the padding.
    for name, unsharded in (("ddp_like_zero1", "ddp_like"), ("dp2xtp2_zero1", None)):
        groups = runs[name]["group_elements"]
        assert runs[name]["state_bytes"] == sum(-(-n // 2) for n in groups) * ADAM_STATES * 4
        if unsharded:
            assert runs[unsharded]["state_bytes"] == sum(groups) * ADAM_STATES * 4
    print(
        f"RUNTIME ZeRO-1 state bytes per rank {runs['ddp_like_zero1']['state_bytes']}, "
        f"unsharded {runs['ddp_like']['state_bytes']}"
    )

    moved = worlds(2).run(
        "mesh_runtime_cases:checkpoint_round_trip",
        model,
        settings,
        TWO_RANKS["pp2"],
        TWO_RANKS["tp2"],
        str(tmp_path / "step2"),
    )
    assert moved[0]["tensors"] > 0 and moved[0]["max_difference"] == 0.0, moved[0]
    assert moved[0]["manifest_layout"]["pp"] == 2 and moved[0]["meta_step"] == 2

    # The Trainer starts from its weights (trainer.init_from); a resume is refused in one line.
    from lightning_dist.checkpoint.safe import CheckpointError
    from lightning_dist.checkpoint.store import verify_checkpoint
    from lightning_dist.models.args import ModelArgs

    with pytest.raises(CheckpointError, match="plain PyTorch loop .* trainer.init_from="):
        verify_checkpoint(tmp_path / "step2", ModelArgs(**model))


def test_zero1_pads_an_uneven_last_shard_and_steps_as_one_optimizer(worlds):
    """Groups of 50 and 8 elements over 2 ranks and over 4: each rank holds ceil(N / dp) elements
    of each state, and the parameters and the gathered states equal the unsharded AdamW's, also
    after a step where a layer has no gradient and one where none has."""
    for size in (2, 4):
        for rank in worlds(size).run("mesh_runtime_cases:uneven_zero1_shards"):
            assert rank["group_elements"] == [50, 8]
            held = sum(-(-n // size) for n in rank["group_elements"])  # 25 + 4, 13 + 2
            assert rank["state_bytes"] == held * ADAM_STATES * 4, (size, rank)
            assert rank["param_diff"] == 0.0 and rank["state_diff"] == 0.0, rank
            assert rank["reloaded"], rank
            # parameters without a gradient keep their value and moments, as torch's skip them
            assert rank["skip_param_diff"] == 0.0 and rank["skip_state_diff"] == 0.0, rank
            # The strategies' ZeRO-1: gradients reduce-scattered, not all-reduced (DDP's hook
            # sends nothing); the only all-reduces left are, per step, the clipping norm's
            # scalar and the flags of which parameters have a gradient on some replica (4).
            calls = rank["collectives"]
            assert calls.get("c10d::_reduce_scatter_base_", 0) >= 4 * 2, calls  # pieces, groups
            assert calls.get("c10d::allreduce_") == 2 * 4 and rank["largest_all_reduce"] == 4, rank
            assert rank["reduced_param_diff"] < 1e-6 and rank["reduced_norm_diff"] < 1e-6, rank
    print(
        f"ZERO1 reduce-scatter: collectives per 4 steps {calls}, parameters within "
        f"{rank['reduced_param_diff']:.1e}, norm {rank['reduced_norm_diff']:.1e}"
    )
