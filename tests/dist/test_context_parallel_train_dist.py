"""Context parallelism as a mesh dimension (`strategy.cp`), trained through `train(cfg)` on the
ranks of started worlds (tests/dist/world.py): each layout against one process's stored
reference (tests/dist/baselines.py `llama_debug_val5_clip_eps`: llama_debug, synthetic data of
128 tokens, fp32, 10 steps, validation after steps 5 and 10). Every step's train loss and both
validation losses agree within 1e-5 relative, and summary.json shows that each rank's attention
ran through the context-parallel step (so the match is not one of whole sequences). The
`packed_` cases train packed documents (`data.pack_documents=true`: about 4 documents per
window, so every rank's chunks hold parts of several) against one process with the same
document mask (`llama_debug_val5_clip_eps_packed`); with the mask left out of the all-gather
attention, cp2 differs from it by 5.6e-3 (train) and 8.1e-3 (validation), measured. The `hf_`
cases train a tiny random Hugging Face Llama, whose attention runs through
transformers' registry (`parallel/hf_context_parallel.py`), against `hf_llama_lr1e-2`: 128
tokens, fp32, 10 steps, no validation."""

from __future__ import annotations

import time

import baselines
import pytest

from lightning_dist.run.parity_runs import max_relative_difference

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5
"""Tighter than the issue's 1e-4 (the runs match to 2.3e-7): a rank that attends at the wrong
rotary positions (its chunks fed as positions 0 .. s/cp - 1) drifts from one device by 9.8e-5
in these 10 steps (measured), which 1e-4 would let pass."""
# The reference `llama_debug_val5_clip_eps`: a learning rate at which the model learns within
# 10 steps (at the default one a rank attending at the wrong rotary positions still matches
# one device to 5e-6, measured), and hard clipping with an Adam eps large enough that the
# clipped scale changes the updates, so the global norm over the cp ranks is checked too.
BASE = [
    "model=llama_debug", "data=synthetic", "logger=none", "trainer.max_steps=10",
    "trainer.val_check_interval=5", "trainer.gradient_clip_val=0.05", "optim.eps=1e-3",
    "optim.warmup_steps=1", "optim.lr=3e-2", *baselines.QUIET,
]  # fmt: skip
# Hugging Face models at a learning rate at which a rank whose RoPE ignores its chunks' positions
# drifts from one device by 2.2e-3 (at the default one: 8.4e-6, within TOLERANCE), measured.
HF_BASE = [
    "model=hf_llama", "data=synthetic", "logger=none", "trainer.max_steps=10",
    "trainer.val_check_interval=null", "optim.lr=1e-2", "optim.warmup_steps=1", *baselines.QUIET,
]  # fmt: skip
CP2 = ["strategy=3d", "strategy.cp=2"]
PACKED = "data.pack_documents=true"
CASES = {  # name: (overrides, the layout summary.json must show)
    "cp2_allgather": ([*CP2, "hardware.devices=2"], {"dp_shard": 1, "cp": 2, "tp": 1}),
    # Ulysses under op-level activation checkpointing (the recomputed forward exchanges again).
    "cp2_ulysses_ac_op": (
        [*CP2, "strategy.cp_mode=ulysses", "strategy.activation_checkpointing=op",
         "hardware.devices=2"],
        {"dp_shard": 1, "cp": 2, "tp": 1},
    ),
    "dp2xcp2": ([*CP2, "hardware.devices=4"], {"dp_shard": 2, "cp": 2, "tp": 1}),
    "cp2xtp2": ([*CP2, "strategy.tp=2", "hardware.devices=4"], {"dp_shard": 1, "cp": 2, "tp": 2}),
    # Each pipeline stage takes the chunks' positions (each of the 4 microbatches its rows).
    "cp2xpp2": ([*CP2, "strategy.pp=2", "hardware.devices=4"], {"pp": 2, "dp_shard": 1, "cp": 2}),
    # Packed documents: documents and positions shard with the tokens, over CP ranks and
    # HSDP (FSDP over dp_shard x cp = 2 ranks, replicated over dp_replicate = 2: each
    # replica its rows) ...
    "packed_hsdp2xcp2": (
        [*CP2, "strategy.dp_replicate=2", "hardware.devices=4", PACKED],
        {"dp_replicate": 2, "dp_shard": 1, "cp": 2},
    ),
    # ... with tensor parallelism under Ulysses ...
    "packed_cp2xtp2_ulysses": (
        [*CP2, "strategy.tp=2", "strategy.cp_mode=ulysses", "hardware.devices=4", PACKED],
        {"dp_shard": 1, "cp": 2, "tp": 2},
    ),
    # ... and cut into the pipeline's microbatches by rows.
    "packed_cp2xpp2": (
        [*CP2, "strategy.pp=2", "hardware.devices=4", PACKED], {"pp": 2, "dp_shard": 1, "cp": 2}
    ),
    # Hugging Face models (HF_BASE): transformers' attention calls our registered function.
    "hf_cp2_allgather": ([*CP2, "hardware.devices=2"], {"dp_shard": 1, "cp": 2, "tp": 1}),
    "hf_cp2_ulysses": (
        [*CP2, "strategy.cp_mode=ulysses", "hardware.devices=2"], {"dp_shard": 1, "cp": 2, "tp": 1}
    ),
    # HF Qwen2 (q/k/v biases) at cp2 allgather ran here until 2026-12-04 (7.6e-8; cut for the
    # suite's time: its attention goes through the same registry as hf_llama's).
}  # fmt: skip


def _base(name: str) -> list[str]:
    """The overrides case `name` shares with its reference (less the layout)."""
    return HF_BASE if name.startswith("hf_") else BASE


_runs: dict[str, tuple[dict, object]] = {}


def _train(name: str, train_in, tmp_path_factory) -> tuple[dict, object]:
    """(summary, run folder) of case `name`, trained once in this module."""
    if name not in _runs:
        run = [*_base(name), *CASES[name][0], "report=false"]  # the report changes no loss
        if name == "dp2xcp2":  # with the comm monitor (FSDP's and CP's traffic each named)
            # and a checkpoint after step 5 for the resume test below
            run = [o for o in run if o not in baselines.QUIET]
            run.append("trainer.checkpoint.every_n_train_steps=5")
        folder = tmp_path_factory.mktemp(name)
        _runs[name] = train_in(run, folder), folder
    return _runs[name]


def test_context_parallel_layouts_match_one_process(train_in, tmp_path_factory):
    failures = []
    for name, (overrides, degrees) in CASES.items():
        kept = [o for o in overrides if o == PACKED]  # what the reference ran too
        single = ["strategy=single", "hardware.devices=1"]
        reference = baselines.reference([*_base(name), *kept, *single])
        started = time.perf_counter()
        summary, _ = _train(name, train_in, tmp_path_factory)
        seconds = time.perf_counter() - started
        diff = max_relative_difference(reference["losses"], summary["losses"])
        val_diff = max_relative_difference(reference["val_losses"], summary["val_losses"])
        cp = summary.get("context_parallel") or {}
        print(f"PARITY {name}: train {diff:.3e}, val {val_diff:.3e}, {cp}, {seconds:.1f} s")
        layout = {k: summary["layout"][k] for k in degrees}
        mode = "ulysses" if "strategy.cp_mode=ulysses" in overrides else "allgather"
        if layout != degrees or cp.get("mode") != mode or not cp.get("attention_calls"):
            failures.append((name, summary["layout"], cp))
        if name == "dp2xcp2":
            by_dim = summary["comm"]["comm_compute_ratio_by_dim"]
            print(f"  comm/compute by dim: {by_dim}")
            if not (by_dim.get("cp", 0) > 0 and by_dim.get("dp_shard_cp", 0) > 0):
                failures.append((name, by_dim))
        if len(summary["losses"]) != 10 or diff > TOLERANCE or val_diff > TOLERANCE:
            failures.append((name, diff, val_diff, summary["losses"], summary["val_losses"]))
    assert not failures, failures


def test_a_dp2_cp2_checkpoint_resumes_under_one_process_and_tp2(train_in, tmp_path_factory):
    """The step-5 checkpoint of dp2 x cp2 (parameters sharded over dp_shard x cp) resumed by
    one process and by tp2: steps 6 to 10 give the reference's losses."""
    reference = baselines.reference([*BASE, "strategy=single", "hardware.devices=1"])
    _, folder = _train("dp2xcp2", train_in, tmp_path_factory)
    checkpoint = folder / "checkpoints" / "step5.ckpt"
    failures = []
    for name, layout in (
        ("single", ["strategy=single", "hardware.devices=1"]),
        ("tp2", ["strategy=tp", "hardware.devices=2"]),
    ):
        run = [*BASE, *layout, "report=false", f"trainer.ckpt_path={checkpoint}"]
        resumed = train_in(run, tmp_path_factory.mktemp(f"resume_{name}"))
        diff = max_relative_difference(reference["losses"][5:], resumed["losses"][5:])
        print(f"RESUME dp2xcp2 -> {name}: steps 6-10 {diff:.3e}")
        if len(resumed["losses"]) != 10 or diff > TOLERANCE:
            failures.append((name, diff, resumed["losses"]))
    assert not failures, failures
