"""FSDP1 and FSDP2 in real gloo processes: parity with one process through the harness, resume
from sharded and full checkpoints, memory against DDP, one-line errors, and user code.

The candidate runs are shared: the FULL_SHARD run also saves the checkpoint that the resume test
restarts from and gives the memory test its numbers, so each configuration trains once. Every run
clips gradients hard (0.05) so the global-norm clipping path is exercised in all of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_dist.parity import REPO_ROOT, max_relative_difference, reference_overrides, run_train

pytestmark = pytest.mark.slow

BASE = [
    "model=llama_debug", "data=synthetic", "logger=none", "trainer.max_steps=10",
    "trainer.val_check_interval=null", "trainer.gradient_clip_val=0.05",
]  # fmt: skip
FSDP = ["strategy=fsdp", "hardware.devices=2"]
FSDP2 = ["strategy=fsdp2", "hardware.devices=2"]
SAVE_AT_5 = ["trainer.checkpoint.every_n_train_steps=5"]
CASES = {
    # name: (overrides, expected (dp_replicate, dp_shard))
    "fsdp_full_shard": ([*FSDP, "strategy.sharding_strategy=FULL_SHARD", *SAVE_AT_5], (1, 2)),
    "fsdp_shard_grad_op_ac": (
        [*FSDP, "strategy.sharding_strategy=SHARD_GRAD_OP", "strategy.activation_checkpointing=1"],
        (1, 2),
    ),
    "fsdp_no_shard": ([*FSDP, "strategy.sharding_strategy=NO_SHARD"], (2, 1)),
    "fsdp_hybrid_2x2": (
        [
            "strategy=fsdp",
            "hardware.devices=4",
            "strategy.sharding_strategy=HYBRID_SHARD",
            "strategy.hybrid_shard_size=2",
        ],
        (2, 2),
    ),  # fmt: skip
    "fsdp2_reshard_full_ckpt": ([*FSDP2, "strategy.state_dict_type=full", *SAVE_AT_5], (1, 2)),
    "fsdp2_no_reshard_ac": (
        [*FSDP2, "strategy.reshard_after_forward=false", "strategy.activation_checkpointing=2"],
        (1, 2),
    ),
    "fsdp2_hsdp_2x2": (["strategy=fsdp2", "hardware.devices=4", "strategy.dp_replicate=2"], (2, 2)),
}
_RUNS: dict[str, tuple[dict, Path]] = {}


def _run(name: str, overrides: list[str], tmp_path_factory) -> tuple[dict, Path]:
    """Train once per name in this session; returns (summary, run directory)."""
    if name not in _RUNS:
        run_dir = tmp_path_factory.mktemp(name)
        _RUNS[name] = (run_train(overrides, run_dir), run_dir)
    return _RUNS[name]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[float]:
    """The single-process losses, computed once for every case (the harness's reference)."""
    summary, _ = _run("reference", reference_overrides(BASE), tmp_path_factory)
    return summary["losses"]


@pytest.mark.parametrize("name", list(CASES))
def test_parity_with_one_process(name, reference, tmp_path_factory):
    overrides, (replicate, shard) = CASES[name]
    summary, _ = _run(name, [*BASE, *overrides], tmp_path_factory)
    diff = max_relative_difference(reference, summary["losses"])
    print(f"{name}: max relative difference {diff:.3e} over {len(reference)} steps")
    assert diff <= 1e-4, list(zip(reference, summary["losses"], strict=False))
    assert (summary["layout"]["dp_replicate"], summary["layout"]["dp_shard"]) == (replicate, shard)
    assert len(summary["memory_by_category"]) == summary["world_size"]


@pytest.mark.parametrize("name", ["fsdp_full_shard", "fsdp2_reshard_full_ckpt"])
def test_resume_continues_with_the_same_losses(name, tmp_path_factory):
    """Save at step 5 (fsdp, and fsdp2 with state_dict_type=full), resume in a new process:
    steps 6-10 are bitwise the uninterrupted run's."""
    overrides = [*BASE, *CASES[name][0]]
    full, run_dir = _run(name, overrides, tmp_path_factory)
    checkpoint = run_dir / "checkpoints" / "step5.ckpt"
    assert (checkpoint / "manifest.json").is_file(), "every strategy saves the one folder format"
    resumed = run_train([*overrides, f"trainer.ckpt_path={checkpoint}"],
                        tmp_path_factory.mktemp(f"{name}_resumed"))  # fmt: skip
    assert resumed["losses"] == full["losses"][5:10]


def test_full_shard_model_state_is_half_of_ddp(tmp_path_factory):
    """Per rank, params + grads + optimizer state under FULL_SHARD <= DDP's / 2 + 2% padding."""
    ddp, _ = _run("ddp", [*BASE, "strategy=ddp", "hardware.devices=2"], tmp_path_factory)
    fsdp, _ = _run("fsdp_full_shard", [*BASE, *CASES["fsdp_full_shard"][0]], tmp_path_factory)

    def model_state(summary):
        return [m["params"] + m["grads"] + m["optimizer"] for m in summary["memory_by_category"]]

    print("model-state bytes per rank: DDP", model_state(ddp), "FULL_SHARD", model_state(fsdp))
    for ddp_bytes, fsdp_bytes in zip(model_state(ddp), model_state(fsdp), strict=True):
        assert fsdp_bytes <= ddp_bytes / 2 * 1.02
    assert all(m["activations"] > 0 and m["total"] > 0 for m in fsdp["memory_by_category"])


BAD_INPUTS = {
    "unknown sharding strategy": (
        ["strategy=fsdp", "strategy.sharding_strategy=ZERO3"],
        "FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, _HYBRID_SHARD_ZERO2, NO_SHARD",
    ),
    "hybrid shard size": (
        [
            "strategy=fsdp",
            "strategy.sharding_strategy=HYBRID_SHARD",
            "strategy.hybrid_shard_size=3",
            "hardware.devices=4",
        ],
        "hybrid_shard_size=3 does not divide the world size 4",
    ),  # fmt: skip
    "auto-wrap class absent": (
        ["strategy=fsdp", "strategy.auto_wrap=[LlamaDecoderLayer]"],
        "block classes are: TransformerBlock",
    ),
    "cpu offload on cpu": (["strategy=fsdp", "strategy.cpu_offload=true"], "cpu_offload=true"),
    "fsdp2 replicas": (
        ["strategy=fsdp2", "strategy.dp_replicate=3", "hardware.devices=4"],
        "dp_replicate=3 does not divide the world size 4",
    ),
}


def test_bad_inputs_fail_with_one_line_before_training(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {
        name: subprocess.Popen(
            [
                sys.executable,
                str(REPO_ROOT / "train.py"),
                *overrides,
                "model=llama_debug",
                "data=synthetic",
                "logger=none",
                f"hydra.run.dir={tmp_path / name.replace(' ', '_')}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=env,
        )  # fmt: skip
        for name, (overrides, _) in BAD_INPUTS.items()
    }
    for name, proc in runs.items():
        _, stderr = proc.communicate(timeout=300)
        expected = BAD_INPUTS[name][1]
        assert proc.returncode == 2, f"{name}: exit {proc.returncode}\n{stderr[-2000:]}"
        assert "Traceback" not in stderr, f"{name}: {stderr[-2000:]}"
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and expected in errors[0], f"{name}: {stderr[-2000:]}"
        assert not (tmp_path / name.replace(" ", "_") / "summary.json").exists()


USER_SCRIPT = Path(__file__).with_name("fsdp_user_module.py")


def test_user_lightning_module_trains_with_our_strategies(tmp_path):
    """A LightningModule written as a user would: `strategy="fsdp_tuned"`, a TunedFSDPStrategy
    object and `strategy="fsdp2"`, each on 2 CPU ranks (see tests/dist/fsdp_user_module.py)."""
    script = tmp_path / "user_script.py"  # the launcher re-runs sys.argv, so run a real file
    script.write_text(USER_SCRIPT.read_text())
    out = tmp_path / "results.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    results = json.loads(out.read_text())
    assert results["fsdp_tuned"]["strategy"] == results["object"]["strategy"] == "TunedFSDPStrategy"
    assert results["fsdp2"]["strategy"] == "FSDP2Strategy"
    # The 3 blocks were found (by name, or detected) and wrapped, plus the root.
    assert results["fsdp_tuned"]["units"] == results["object"]["units"] == 4
    for name, result in results.items():
        losses = result["losses"]
        assert len(losses) == 30 and losses[-1] < 0.2 * losses[0], name
