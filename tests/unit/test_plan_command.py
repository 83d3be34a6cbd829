"""The planner speaks train.py: its assumptions, a legend, a table that fits 120 columns, a host
memory column for offload, and for every row the `python train.py ...` command that runs it."""

from __future__ import annotations

import shlex

import pytest

from lightning_dist.config import compose_config, hardware_spec, model_spec
from lightning_dist.contract import contract_of
from lightning_dist.layout import Batch
from lightning_dist.plan import compile_settings, main, train_command
from lightning_dist.planner import plan_layouts
from lightning_dist.run.plan import build_strategy
from lightning_dist.run.preflight import estimate_run

PLAN_70B = ["model=llama3_70b", "hardware=dgx_h100", "hardware.num_nodes=4"]


def _command_args(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[:2] == ["python", "train.py"], command
    return words[2:]


def test_table_states_its_assumptions_fits_120_columns_and_has_a_legend(capsys):
    assert main([*PLAN_70B, "--top", "8"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("model llama3_70b (70.55B parameters), bf16-mixed, AdamW; ")
    assert "global batch 16 x 256 tokens" in lines[0]
    assert "the CPU defaults of data=text" in out and "data.global_batch_size=" in out
    assert max(map(len, lines)) <= 120, max(lines, key=len)
    assert (
        "legend:" in out and "mbs = micro-batch" in out and "ac = activation checkpointing" in out
    )
    assert "offload =" in out
    assert "run it: python train.py model=llama3_70b hardware=dgx_h100" in out


def test_details_add_memory_by_category(capsys):
    assert main([*PLAN_70B, "--top", "2", "--details"]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if "layout" in line)
    assert all(name in header for name in ("params", "grads", "optim", "acts", "buffers"))


def test_offload_rows_show_host_memory(capsys):
    args = ["model=llama3_8b", "hardware=rtx4090_x4", "data.seq_len=2048",
            "data.global_batch_size=8", "--top", "3"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "host GiB" in out
    row = next(line for line in out.splitlines() if "offload" in line and "*" in line)
    assert "29.9" in row  # the offloaded states, in host memory, not a 0.0 on the device


def test_compiled_plans_say_so_and_their_commands_compile(capsys):
    args = ["model=llama3_8b", "hardware=dgx_h100", "strategy=fsdp2", "strategy.compile=true",
            "data.global_batch_size=64", "data.seq_len=4096"]  # fmt: skip
    assert main([*args, "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "per-block torch.compile: inductor, compute time / 1.10 (assumed)"
    assert "compile" in next(line for line in lines if line.startswith(" *"))
    assert main([*args, "--command"]) == 0
    command = _command_args(capsys.readouterr().out.strip())
    assert "strategy.compile=true" in command and "strategy.compile_backend=inductor" in command
    assert main(["model=llama3_8b", "hardware=dgx_h100", "--top", "1"]) == 0
    assert (
        capsys.readouterr().out.splitlines()[1] == "per-block torch.compile: off (strategy.compile)"
    )


def test_command_prints_one_runnable_line(capsys):
    assert main([*PLAN_70B, "--command"]) == 0
    (line,) = capsys.readouterr().out.strip().splitlines()
    args = _command_args(line)
    assert args[:3] == PLAN_70B and "strategy=3d" in args
    assert main([*PLAN_70B, "--command", "all", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("python train.py") == 3 and out.count("# ") == 3


@pytest.mark.parametrize(
    "overrides",
    [
        PLAN_70B,
        ["model=llama3_8b", "hardware=dgx_h100"],
        ["model=llama3_8b", "hardware=rtx4090_x4", "data.seq_len=2048", "data.global_batch_size=8"],
        ["model=llama3_1b", "hardware=rtx4090_x4"],
        ["model=llama3_70b", "hardware=dgx_h100"],  # CPU offload with tp > 1 (strategy=3d)
        ["model=llama3_405b", "hardware=dgx_h100", "hardware.num_nodes=64",
         "data.global_batch_size=512", "data.seq_len=4096"],
        ["model=llama3_8b", "hardware=dgx_h100", "strategy=fsdp2", "strategy.compile=true",
         "data.global_batch_size=64", "data.seq_len=4096"],
    ],
)  # fmt: skip
def test_every_rows_overrides_build_the_layout_the_planner_predicted(tmp_path, overrides):
    """Compose each row's command as train.py does: the strategy's layout, its planner settings
    and the pre-flight estimate are the row's own."""
    cfg = compose_config([*overrides, f"paths.output_dir={tmp_path}"])
    spec, hw = model_spec(cfg), hardware_spec(cfg)
    result = plan_layouts(spec, hw, global_batch_size=int(cfg.data.global_batch_size),
                          seq_len=int(cfg.data.seq_len), precision=cfg.trainer.precision or None,
                          **compile_settings(cfg))  # fmt: skip
    checked = 0
    for cand in result.candidates[:8]:
        run_cfg = compose_config([*_command_args(train_command(overrides, cand)),
                                  f"paths.output_dir={tmp_path}"])  # fmt: skip
        strategy = build_strategy(run_cfg.strategy, hw)
        layout = contract_of(strategy).layout_for(hw.resolved_devices(), hw.num_nodes)
        predicted = estimate_run(Batch.of_config(run_cfg.data), spec, hw, strategy, layout,
                                 run_cfg.trainer.precision or hw.precision)  # fmt: skip
        assert predicted.describe() == cand.describe()
        assert predicted.memory.total == pytest.approx(cand.memory.total)
        checked += 1
    assert checked


def test_the_70b_command_is_what_train_py_plans(tmp_path, capsys):
    """`--command` for 70B on four DGX H100 nodes, run by train.py with plan.only=true: the
    pre-flight predicts the same layout, and it fits."""
    import re
    import shlex

    from lightning_dist.config import compose_config
    from lightning_dist.plan import main
    from lightning_dist.train import train

    plan_70b = ["model=llama3_70b", "hardware=dgx_h100", "hardware.num_nodes=4"]
    assert main([*plan_70b, "--command"]) == 0
    words = shlex.split(capsys.readouterr().out.strip())
    assert words[:2] == ["python", "train.py"], words
    main([*plan_70b, "--top", "1"])
    label = re.search(r"^chosen: (.+)$", capsys.readouterr().out, re.MULTILINE).group(1)
    result = train(compose_config([*words[2:], "plan.only=true", f"paths.output_dir={tmp_path}"]))
    out = capsys.readouterr().out
    assert result == {"plan_only": True, "fits": True}, out  # train.py exits 0
    assert f"layout: {label}" in out and "fits: yes" in out


@pytest.mark.parametrize(
    "override, message",
    [
        ("+foo=1", "unknown config key foo: the top level takes model,"),
        ("optim.lr=-1", "optim.lr=-1.0 must be 0 or more"),
        ("+hydra.callbacks.x._target_=os.system", "hydra.callbacks.x._target_ is refused"),
        ("model._target_=os.system", "model._target_='os.system' is not allowed"),
    ],
)
def test_the_plan_command_refuses_what_train_py_refuses(override, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([override])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith("error:") and len(err.splitlines()) == 1, err
    assert message in err, err
