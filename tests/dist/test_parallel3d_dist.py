"""Parallel3DStrategy in real gloo processes, through `python train.py` and the parity harness.

Every case is compared with one process on the same overrides (fp32, llama_debug or a tiny HF
Llama, synthetic data, 10 steps): the train loss of every step and, for our model, the
validation loss after steps 5 and 10 must agree within 1e-4 relative. References are run once
per distinct set of overrides and shared. The dp2 x pp2 run also saves the checkpoint that the
resume test restarts from; the 8-rank run clips hard, so it is also the clipping check.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from lightning_dist.parity import REPO_ROOT, max_relative_difference, run_train

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4
BASE = [
    "model=llama_debug", "data=synthetic", "logger=none", "trainer.max_steps=10",
    "trainer.val_check_interval=5",
]  # fmt: skip
HF_BASE = [
    "model=hf_llama", "data=synthetic", "logger=none", "trainer.max_steps=10",
    "trainer.val_check_interval=null",
]  # fmt: skip
# Hard clipping with an Adam eps large enough that the clipped scale changes the updates (Adam
# alone is blind to a uniform gradient scale): a wrong global norm would show in the losses.
CLIP = [*BASE, "trainer.gradient_clip_val=0.05", "optim.eps=1e-3", "optim.warmup_steps=1",
        "optim.lr=3e-2"]  # fmt: skip
INTERLEAVED = ["strategy.virtual_stages=2"]
SAC_COMPILE = ["strategy.activation_checkpointing=op", "strategy.compile=true",
               "strategy.compile_backend=aot_eager"]  # fmt: skip

CASES = {
    "tp2": (BASE, ["strategy=tp", "hardware.devices=2"]),
    "tp2_sp": (BASE, ["strategy=tp", "hardware.devices=2", "strategy.sequence_parallel=true"]),
    "pp2_GPipe": (BASE, ["strategy=pp", "hardware.devices=2", "strategy.schedule=GPipe"]),
    "pp2_1F1B": (BASE, ["strategy=pp", "hardware.devices=2", "strategy.schedule=1F1B"]),
    "pp2_Interleaved1F1B": (
        BASE, ["strategy=pp", "hardware.devices=2", "strategy.schedule=Interleaved1F1B", *INTERLEAVED]
    ),
    "pp2_InterleavedZeroBubble": (
        BASE,
        ["strategy=pp", "hardware.devices=2", "strategy.schedule=InterleavedZeroBubble", *INTERLEAVED],
    ),
    "pp2_ZBVZeroBubble": (
        BASE, ["strategy=pp", "hardware.devices=2", "strategy.schedule=ZBVZeroBubble", *INTERLEAVED]
    ),
    # Lightning's gradient accumulation (2 micro-batches of 4) on top of 4 pipeline microbatches.
    "pp2_accumulate": (BASE, ["strategy=pp", "hardware.devices=2", "data.micro_batch_size=4"]),
    "dp2xtp2": (BASE, ["strategy=3d", "strategy.tp=2", "hardware.devices=4"]),
    "dp2xpp2": (
        BASE,
        ["strategy=3d", "strategy.pp=2", "hardware.devices=4", "trainer.checkpoint.every_n_train_steps=5"],
    ),
    "tp2xpp2_ac": (
        BASE,
        ["strategy=3d", "strategy.tp=2", "strategy.pp=2", "hardware.devices=4",
         "strategy.activation_checkpointing=1"],
    ),
    # Op-level (selective) checkpointing and per-block compilation together (aot_eager: the
    # same traced graphs as inductor without C++ generation, which is slow on 2 cores).
    "fsdp2_op_compile": (BASE, ["strategy=fsdp2", "hardware.devices=2", *SAC_COMPILE]),
    "dp2xpp2_op_compile": (BASE, ["strategy=3d", "strategy.pp=2", "hardware.devices=4", *SAC_COMPILE]),
    "dp2xtp2xpp2_clip": (CLIP, ["strategy=3d", "strategy.tp=2", "strategy.pp=2", "hardware.devices=8"]),
    "hf_tp2": (HF_BASE, ["strategy=tp", "hardware.devices=2"]),
    "hf_pp2": (HF_BASE, ["strategy=pp", "hardware.devices=2"]),
    "hf_dp2xtp2": (HF_BASE, ["strategy=3d", "strategy.tp=2", "hardware.devices=4"]),
}  # fmt: skip

_runs: dict[tuple[str, ...], dict] = {}
_dirs: dict[tuple[str, ...], object] = {}


def _run(overrides: list[str], tmp_path_factory) -> dict:
    key = tuple(overrides)
    if key not in _runs:
        _dirs[key] = tmp_path_factory.mktemp("run")
        _runs[key] = run_train(overrides, _dirs[key])
    return _runs[key]


def _val_difference(reference: dict, candidate: dict) -> float:
    if not reference["val_losses"]:
        return 0.0
    return max_relative_difference(reference["val_losses"], candidate["val_losses"])


@pytest.mark.parametrize("name", [n for n in CASES if n != "dp2xtp2xpp2_clip"])
def test_parity_with_one_process(name, tmp_path_factory):
    base, layout = CASES[name]
    reference = _run([*base, "strategy=single", "hardware.devices=1"], tmp_path_factory)
    candidate = _run([*base, *layout], tmp_path_factory)
    diff = max_relative_difference(reference["losses"], candidate["losses"])
    val_diff = _val_difference(reference, candidate)
    print(f"PARITY {name}: train {diff:.3e}, val {val_diff:.3e} ({candidate['world_size']} ranks)")
    assert diff <= TOLERANCE, (name, reference["losses"], candidate["losses"])
    assert val_diff <= TOLERANCE, (name, reference["val_losses"], candidate["val_losses"])
    if base is BASE:
        assert len(candidate["val_losses"]) == 2, "validation ran after steps 5 and 10"
    assert (
        candidate["layout"]["tp"] * candidate["layout"]["pp"] * candidate["layout"]["dp_shard"]
        == candidate["world_size"]
    )


def test_eight_ranks_with_clipping_match_one_process(tmp_path_factory):
    """dp2 x tp2 x pp2 with hard gradient clipping: the global norm spans every mesh dim."""
    base, layout = CASES["dp2xtp2xpp2_clip"]
    reference = _run([*base, "strategy=single", "hardware.devices=1"], tmp_path_factory)
    unclipped = _run([*BASE, "optim.eps=1e-3", "optim.warmup_steps=1", "optim.lr=3e-2",
                      "trainer.gradient_clip_val=null", "strategy=single", "hardware.devices=1"],
                     tmp_path_factory)  # fmt: skip
    started = time.perf_counter()
    candidate = _run([*base, *layout], tmp_path_factory)
    seconds = time.perf_counter() - started
    diff = max_relative_difference(reference["losses"], candidate["losses"])
    val_diff = _val_difference(reference, candidate)
    print(
        f"PARITY dp2xtp2xpp2_clip: train {diff:.3e}, val {val_diff:.3e}, 8 ranks in {seconds:.0f}s"
    )
    assert candidate["layout"] == {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "tp": 2}
    assert diff <= TOLERANCE and val_diff <= TOLERANCE, (reference, candidate)
    # Clipping really acted: without it the same run learns differently.
    assert max_relative_difference(unclipped["losses"], reference["losses"]) > 1e-3


def test_resume_under_dp2_pp2_repeats_the_losses(tmp_path_factory):
    base, layout = CASES["dp2xpp2"]
    full = _run([*base, *layout], tmp_path_factory)
    checkpoint = _dirs[tuple([*base, *layout])] / "checkpoints" / "step5.ckpt"
    assert checkpoint.is_dir(), "a sharded checkpoint is a folder"
    resumed = run_train(
        [*base, *layout[:-1], f"trainer.ckpt_path={checkpoint}"], tmp_path_factory.mktemp("resume")
    )
    assert resumed["losses"] == full["losses"][5:10]


def test_sharded_init_trains(tmp_path_factory):
    """init_sharded: each rank initialises only its shards; not the single-process weights, but a
    sane start (about ln(vocab)) and finite losses."""
    summary = _run([*BASE, "trainer.max_steps=4", "strategy=3d", "strategy.tp=2",
                    "strategy.init_sharded=true", "hardware.devices=2"], tmp_path_factory)  # fmt: skip
    assert abs(summary["losses"][0] - 6.238) < 0.1
    assert all(loss == loss for loss in summary["losses"])


def test_user_module_example_runs_with_tp_and_pp():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "user_module_3d.py"), "--tp", "2", "--pp", "2"],
        capture_output=True, text=True, timeout=600, env=env, cwd=REPO_ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", result.stdout).groups())
    assert last < first - 0.5, result.stdout[-1000:]


BAD_INPUTS = {
    "degrees": (["strategy=3d", "strategy.tp=2", "strategy.pp=2", "strategy.dp_shard=1",
                 "hardware.devices=2"], "multiply to 4, but the world size is 2"),
    "heads": (["strategy=tp", "hardware.devices=8"], "n_heads=4 is not divisible by tp=8"),
    "kv heads": (["strategy=tp", "hardware.devices=2", "model.n_kv_heads=1"],
                 "n_kv_heads=1 is not divisible by tp=2"),
    "ffn": (["strategy=tp", "hardware.devices=2", "model.ffn_hidden_size=129"],
            "ffn_hidden_size=129 is not divisible by tp=2"),
    "vocab": (["strategy=tp", "hardware.devices=2", "model.vocab_size=513"],
              "vocab_size=513 is not divisible by tp=2"),
    "layers": (["strategy=pp", "hardware.devices=2", "model.n_layers=3",
                "strategy.schedule=Interleaved1F1B", "strategy.virtual_stages=2"],
               "n_layers=3 is fewer than pp=2 x virtual_stages=2 = 4"),
    "microbatches": (["strategy=pp", "hardware.devices=4", "strategy.microbatches=2"],
                     "1F1B needs at least pp=4 microbatches, got 2"),
    "batch": (["strategy=3d", "strategy.pp=2", "hardware.devices=4", "data.global_batch_size=12"],
              "global_batch_size=12 is not divisible by dp=2 x microbatches=4"),
    "no protocol": (["strategy=pp", "hardware.devices=2", "model._target_=tests.dist.plain_model.PlainArgs"],
                    "does not expose its layers for pipeline parallelism"),
    "plan": (["strategy=tp", "hardware.devices=2", "strategy.tp_plan={layers.0.attn.wq:colwise}"],
             "TP plan pattern 'layers.0.attn.wq' matches no module"),
}  # fmt: skip


def test_bad_inputs_fail_before_training_with_one_line(tmp_path):
    """Each is a ValueError raised on every rank before any process group exists: train.py
    exits 2 with one `error:` line, no traceback and no summary."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = {}
    for name, (overrides, _) in BAD_INPUTS.items():
        run_dir = tmp_path / name.replace(" ", "_")
        cmd = [sys.executable, str(REPO_ROOT / "train.py"), "model=llama_debug", "data=synthetic",
               "logger=none", *overrides, f"hydra.run.dir={run_dir}"]  # fmt: skip
        procs[name] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env=env, cwd=REPO_ROOT), run_dir)  # fmt: skip
    for name, (proc, run_dir) in procs.items():
        _, stderr = proc.communicate(timeout=300)
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        expected = BAD_INPUTS[name][1]
        assert proc.returncode == 2, f"{name}: exit {proc.returncode}\n{stderr[-2000:]}"
        assert "Traceback" not in stderr, f"{name}: {stderr[-2000:]}"
        assert len(errors) == 1 and expected in errors[0], f"{name}: {errors or stderr[-2000:]}"
        assert not (run_dir / "summary.json").exists()
