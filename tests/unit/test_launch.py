"""`python -m lightning_dist.launch slurm --dry-run`: the sbatch script of every hardware
profile, and the submitit launcher config sized the same way. One process, no Slurm needed; the
scripts run on a real Slurm in tests/cluster/test_slurm.py. The GPU lines (--gpus-per-node, NCCL
variables) are checked as text here: on this CPU machine no GPU job can run."""

from __future__ import annotations

import pytest

from lightning_dist.launch.__main__ import main


def _dry_run(capsys, *args: str) -> str:
    main(["slurm", "--dry-run", *args])
    return capsys.readouterr().out


def test_dry_run_single_process_strategy_is_one_task(capsys):
    lines = _dry_run(capsys, "strategy=single", "hardware.devices=2").splitlines()
    assert "#SBATCH --nodes=1" in lines and "#SBATCH --ntasks-per-node=1" in lines


def test_dry_run_keeps_a_given_run_dir_and_resume(capsys):
    text = _dry_run(capsys, "hydra.run.dir=/data/run7", "trainer.resume=auto")
    assert 'run_dir="/data/run7"' in text and text.count("trainer.resume=auto") == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["hardware=gpu"], "hardware=gpu has devices=-1"),
        (["hardware=dgx_h100", "data.global_batch_size=12"], "not divisible"),
        (["strategy=nope"], "Could not find 'strategy/nope'"),
        (["strategy"], "is not a KEY=VALUE override"),
    ],
    ids=["gpu_without_count", "batch_split", "unknown_strategy", "no_equals"],
)
def test_dry_run_refuses_a_bad_run_in_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as stop:
        _dry_run(capsys, *args)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and message in err, err


@pytest.mark.filterwarnings(r"ignore:\s*'hydra/launcher/submitit_slurm' is validated")
def test_submitit_launcher_config_is_sized_from_the_hardware():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from lightning_dist.config import CONF_DIR

    overrides = ["hydra/launcher=submitit_slurm", "hardware=dgx_h100", "hardware.num_nodes=2"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"].endswith("submitit_launcher.SlurmLauncher")
    assert (launcher["nodes"], launcher["tasks_per_node"], launcher["gpus_per_node"]) == (2, 8, 8)
    assert launcher["cpus_per_task"] == 224 // 8
    assert launcher["additional_parameters"] == {"signal": "USR1@120", "requeue": True}
    (setup,) = launcher["setup"]
    assert "export NCCL_IB_HCA=mlx5" in setup.splitlines()
