"""The planner speaks train.py: its assumptions, a legend, a table that fits 120 columns, a host
memory column for offload, and for every row the `python train.py ...` command that runs it."""

from __future__ import annotations

import shlex
from dataclasses import replace

import pytest

from lightning_dist.config import compose_config, hardware_spec, model_spec
from lightning_dist.contract import contract_of
from lightning_dist.layout import Batch
from lightning_dist.plan import main
from lightning_dist.planner import plan_layouts
from lightning_dist.run.plan import build_strategy
from lightning_dist.run.plan_table import compile_settings, train_command
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
    args = [
        "model=llama3_8b",
        "hardware=rtx4090_x4",
        "data.seq_len=1024",
        "data.global_batch_size=8",
        "--top",
        "3",
    ]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("host GiB" in line for line in lines)
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("*"))
    assert "offload" in lines[at] + lines[at + 1]  # a long layout label folds onto the next line
    assert "29.9" in lines[at]  # the offloaded states, in host memory, not a 0.0 on the device


def test_compiled_plans_say_so_and_their_commands_compile(capsys):
    args = [
        "model=llama3_8b",
        "hardware=dgx_h100",
        "strategy=fsdp2",
        "strategy.compile=true",
        "data.global_batch_size=64",
        "data.seq_len=4096",
    ]
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
        [
            "model=llama3_405b",
            "hardware=dgx_h100",
            "hardware.num_nodes=64",
            "data.global_batch_size=512",
            "data.seq_len=4096",
        ],
        [
            "model=llama3_8b",
            "hardware=dgx_h100",
            "strategy=fsdp2",
            "strategy.compile=true",
            "data.global_batch_size=64",
            "data.seq_len=4096",
        ],
        ["model=tiny", "hardware=dgx_h100"],  # strategy=ddp rows (tp, pp: llama3_1b above)
        ["model=tiny", "hardware=cpu", "hardware.devices=1"],  # strategy=single
        [
            "model=llama3_8b",
            "hardware=dgx_h100",
            "hardware.num_nodes=4",
            "data.seq_len=131072",
            "data.global_batch_size=32",
        ],  # cp > 1 (strategy.cp, cp_mode)
        [
            "model=llama3_70b",
            "hardware=mixed_h100_a100",
            "data.global_batch_size=256",
            "data.seq_len=4096",
        ],  # mixed hardware: speed-balanced strategy.split_points
        [
            "model=mixtral_8x7b",
            "hardware=dgx_h100",
            "hardware.num_nodes=2",
            "data.global_batch_size=64",
            "data.seq_len=4096",
        ],  # strategy.ep
    ],
)
def test_every_rows_overrides_build_the_layout_the_planner_predicted(tmp_path, overrides):
    """Compose each row's command as train.py does: the strategy's layout, its planner settings
    and the pre-flight estimate are the row's own."""
    cfg = compose_config([*overrides, f"paths.output_dir={tmp_path}"])
    spec, hw = model_spec(cfg), hardware_spec(cfg)
    result = plan_layouts(
        spec,
        hw,
        global_batch_size=int(cfg.data.global_batch_size),
        seq_len=int(cfg.data.seq_len),
        precision=cfg.trainer.precision or None,
        **compile_settings(cfg),
    )
    checked = 0
    for cand in result.candidates[:8]:
        if cand.planner_only:  # no command (tests/unit/test_planner_layouts.py)
            continue
        run_cfg = compose_config(
            [*_command_args(train_command(overrides, cand)), f"paths.output_dir={tmp_path}"]
        )
        strategy = build_strategy(run_cfg.strategy, hw)
        layout = contract_of(strategy).layout_for(hw.resolved_devices(), hw.num_nodes)
        predicted = estimate_run(
            Batch.of_config(run_cfg.data),
            spec,
            hw,
            strategy,
            layout,
            run_cfg.trainer.precision or hw.precision,
        )
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


# --- the headline command tells the truth (issue 30) -------------------------------------------

HEADLINE = ["strategy=fsdp", "hardware=dgx_h100"]


def _readme_block(command: str) -> list[str]:
    """The lines README.md shows under `$ <command>`, up to the next `$` or the block's end."""
    from pathlib import Path

    lines = (Path(__file__).resolve().parents[2] / "README.md").read_text().splitlines()
    start = lines.index(f"$ {command}") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(("$ ", "```")))
    return lines[start:end]


def test_plan_only_names_the_model_its_batch_and_warns_about_a_cpu_model(
    tmp_path, capsys, monkeypatch
):
    """`python train.py strategy=fsdp hardware=dgx_h100 plan.only=true`, as the README shows it:
    the model and its size, a one-line warning naming the fix, the per-rank batch, a step time
    that is no "0.000 s", and the users' strategy names (no NO_SHARD for plain DDP)."""
    import lightning_dist.run.plan_table as plan_cli
    from lightning_dist.train import train

    monkeypatch.setattr(plan_cli, "hydra_task_overrides", lambda: [*HEADLINE, "plan.only=true"])
    cfg = compose_config([*HEADLINE, "plan.only=true", f"paths.output_dir={tmp_path}"])
    assert train(cfg) == {"plan_only": True, "fits": True}
    out = capsys.readouterr().out.splitlines()
    assert out == _readme_block("python train.py strategy=fsdp hardware=dgx_h100 plan.only=true")
    warnings = [line for line in out if line.startswith("warning:")]
    assert warnings == [
        "warning: model=tiny (3.3M parameters) is a CPU model, not one to train "
        "on dgx_h100; plan with model=llama3_8b"
    ]
    assert "  layout: fsdp dp_shard=8 SHARD_GRAD_OP mbs=2" in out
    assert (
        "  per-rank batch: 2 sequences x 256 tokens (one forward); global batch 16 over 8 "
        "data-parallel ranks" in out
    )
    assert any(line.startswith("  step 642 µs, ") for line in out)
    assert "NO_SHARD" not in "\n".join(out) and "0.000 s" not in "\n".join(out)
    assert out[-1].startswith(
        "  the planner suggests: ddp dp_replicate=8 mbs=2; run it: python "
        "train.py hardware=dgx_h100 strategy=ddp"
    )


def test_the_planner_cli_uses_the_same_words(capsys):
    assert main([*HEADLINE, "--top", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].startswith("warning: model=tiny (3.3M parameters) is a CPU model")
    assert "NO_SHARD" not in "\n".join(lines)
    rows = [line.split() for line in lines if line[:3].strip() in ("*", "1", "2")]
    assert [r[1] for r in rows] == ["ddp", "fsdp2", "fsdp2"] and rows[0][-6:-4] == ["629", "µs"]
    chosen = lines.index("chosen: ddp dp_replicate=8 mbs=2")
    assert lines[chosen + 1].startswith("per-rank batch: 2 sequences x 256 tokens (one forward)")
    assert lines[chosen + 2] == "run it: python train.py hardware=dgx_h100 strategy=ddp"


@pytest.mark.parametrize(
    "overrides, warned",
    [
        (["hardware=dgx_h100"], "model=llama3_8b"),  # tiny: the CPU default
        (["hardware=rtx4090_x4", "model=llama_debug"], "model=llama3_1b"),  # 8B's states: 128 GB
        (["hardware=gpu", "model=tiny"], "model=llama3_1b"),  # unknown memory
        (["hardware=dgx_h100", "model=gpt2_small"], None),  # 124M parameters
        (["hardware=cpu"], None),  # a CPU model on CPUs
    ],
)
def test_a_cpu_model_on_gpus_is_warned_about(overrides, warned):
    from lightning_dist.run.plan_table import model_warning

    cfg = compose_config(overrides)
    name = next((o.split("=")[1] for o in overrides if o.startswith("model=")), "tiny")
    line = model_warning(model_spec(cfg), hardware_spec(cfg), name)
    assert (line is None) if warned is None else line.endswith(f"plan with {warned}"), line


def test_step_times_keep_three_significant_digits():
    from lightning_dist.planner.labels import format_seconds

    assert [format_seconds(s) for s in (1.86e-4, 0.0744, 1.03, 9.55, 1234.5)] == [
        "186 µs",
        "74.4 ms",
        "1.03 s",
        "9.55 s",
        "1,234 s",
    ]


def test_labels_name_the_strategy_and_fsdp_modes_only_where_fsdp_runs():
    from lightning_dist.layout import Layout
    from lightning_dist.planner import TrainSettings, describe
    from lightning_dist.planner.labels import strategy_name

    base = TrainSettings.of(global_batch_size=16, seq_len=256, micro_batch_size=2)
    ddp = replace(base, sharding="NO_SHARD")
    cases = [
        (Layout(), ddp, "single mbs=2"),
        (Layout(dp_replicate=8), ddp, "ddp dp_replicate=8 mbs=2"),
        (Layout(dp_replicate=8), ddp.with_knobs(activation_checkpointing="op"),
         "fsdp2 dp_replicate=8 mbs=2 ac=op"),
        (Layout(dp_shard=8), base, "fsdp2 dp_shard=8 FULL_SHARD mbs=2"),
        (Layout(tp=8), ddp, "tp tp=8 mbs=2"),
        (Layout(pp=8, microbatches=8), ddp, "pp pp=8 1F1B mbs=2"),
        (Layout(dp_replicate=4, tp=2), ddp, "3d dp_replicate=4 tp=2 mbs=2"),
        (Layout(dp_shard=8), base.with_knobs(sharding_strategy="FULL_SHARD"),
         "fsdp dp_shard=8 FULL_SHARD mbs=2"),  # FSDP1's options: strategy=fsdp
    ]  # fmt: skip
    for layout, settings, label in cases:
        assert describe(layout, settings) == label
        assert label.startswith(strategy_name(layout, settings) + " ")
    assert describe(Layout(dp_replicate=8), ddp, "toy") == "toy dp_replicate=8 mbs=2"


def test_a_large_model_that_fits_nowhere_at_the_cpu_default_batch_is_planned_at_a_realistic_one(
    capsys,
):
    """DeepSeek-V3 on 32 DGX H100s with data=text's 16 x 256 tokens: no layout spreads 16
    sequences over 256 ranks, so the plan is made at 512 x 4096 (said on stderr) and its
    command carries that batch; a batch the user set is planned as set (and refused)."""
    args = ["model=deepseek_v3", "hardware=dgx_h100", "hardware.num_nodes=32"]
    assert main([*args, "--command"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith(
        "note: the CPU default batch of data=text (16 x 256 tokens) fits no "
        "layout of 256 devices; planned at data.global_batch_size=512 "
        "data.seq_len=4096 instead"
    )
    words = _command_args(out.strip())
    assert "data.global_batch_size=512" in words and "data.seq_len=4096" in words
    assert any(w.startswith("strategy.ep=") and int(w.split("=")[1]) > 1 for w in words)
    assert main([*args, "data.global_batch_size=16"]) == 1
    assert "too small for 256 devices" in capsys.readouterr().err
