"""Pre-flight planner CLI: which layouts fit, and which runs fastest, before renting anything.

    python -m lightning_dist.plan model=llama3_70b hardware=dgx_h100 hardware.num_nodes=4
    python -m lightning_dist.plan model=llama3_405b hardware=dgx_h100 hardware.num_nodes=2048 \\
        data.global_batch_size=2048 data.seq_len=8192 --json

It composes the same Hydra config as train.py (every override train.py takes works here), then
prints what it assumed (model, batch, precision, optimizer), a table of the top layouts that
fits 120 columns (`--details` adds memory by category), a legend, the choice and the
`python train.py ...` command that runs it; `--command` prints only that command (`--command 2`
the command of row 2, `--command all` one per row), and `--json` exactly
{"candidates": [...], "chosen": <index or null>, "rejected": [...]}.
Exit status: 0 when a layout fits, 1 when none does, 2 for a bad config.
"""

from __future__ import annotations

import argparse
import json
import sys

from lightning_dist.layout import Batch
from lightning_dist.run.plan_table import (
    batch_set_by_user,
    compile_settings,
    config_choice,
    print_plan,
    realistic_batch,
    train_command,
)


def _fail(message: str, code: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def _plan(cfg, model, hardware):
    from lightning_dist.planner import plan_layouts

    batch = Batch.of_config(cfg.data)
    mbs = batch.micro_batch_size
    try:
        return plan_layouts(
            model,
            hardware,
            global_batch_size=batch.global_batch_size,
            seq_len=batch.seq_len,
            precision=cfg.trainer.get("precision") or None,
            micro_batch_sizes=(mbs,) if mbs else None,
            **compile_settings(cfg.get("strategy")),
        )
    except ValueError as err:
        _fail(str(err))


def _check_choices(overrides: list[str]) -> None:
    """One clear line for a config name that does not exist, listing the valid ones."""
    from lightning_dist.config import CONF_DIR, choice_names

    for item in overrides:
        key, sep, value = item.lstrip("+~").partition("=")
        if sep and "." not in key and (CONF_DIR / key).is_dir():
            valid = choice_names(key)
            if value not in valid and value != "null":
                _fail(f"unknown {key} {value!r}; valid: {', '.join(valid)}")


def _compose(overrides: list[str]):
    """The composed config and its model and hardware, refused as train.py refuses it: the
    overrides that have Hydra run code, then the schema, `_target_`s, keys (`+foo=1`) and
    numbers (`run.checks.check_config_text`)."""
    from lightning_dist.config.targets import check_hydra_overrides
    from lightning_dist.run.checks import check_config_text

    try:
        check_hydra_overrides(overrides)
    except ValueError as err:
        _fail(str(err))
    _check_choices(overrides)
    from lightning_dist.config import compose_config, hardware_spec, model_spec
    from lightning_dist.run.errors import report_config_error

    try:
        cfg = compose_config(overrides)
        check_config_text(cfg, choices={})  # the group choices: _check_choices above
        return cfg, model_spec(cfg), hardware_spec(cfg)
    except Exception as err:  # Hydra/OmegaConf errors: one line as train.py's, no traceback
        report_config_error(err)


def names_a_strategy(overrides: list[str]) -> bool:
    """Whether the command line sets `strategy=...` or a `strategy.<knob>`: without either,
    the planner searches every layout and train.yaml's default strategy plays no part."""
    return any(o.lstrip("+~").partition("=")[0].split(".")[0] == "strategy" for o in overrides)


def _check_strategy(cfg, overrides: list[str]) -> None:
    """A strategy the command line names is checked as `train.py ... plan.only=true` checks it
    (the same function, `run.strategy_checks.check_strategy_settings`): one line, exit status 2."""
    if not names_a_strategy(overrides):
        return
    from lightning_dist.run.errors import ConfigError, config_errors, report_config_error
    from lightning_dist.run.strategy_checks import check_strategy_settings

    try:
        with config_errors():
            check_strategy_settings(cfg)
    except ConfigError as err:
        report_config_error(err)


def replan_at_a_realistic_batch(cfg, model, hardware, overrides: list[str], result):
    """When nothing fits only because a large model kept the CPU default batch (the user set
    neither `data.global_batch_size` nor `data.seq_len`), the plan at a realistic batch instead,
    said in one line on stderr, with the two overrides added to the ones its commands carry:
    (cfg, overrides, result). Anything else: the arguments unchanged."""
    batch = Batch.of_config(cfg.data)
    realistic = realistic_batch(batch, model)
    if result.chosen is not None or not realistic or batch_set_by_user(overrides):
        return cfg, overrides, result
    print(
        f"note: the CPU default batch of data={config_choice(overrides, 'data')} "
        f"({batch.global_batch_size} x {batch.seq_len} tokens) fits no layout of "
        f"{hardware.world_size} devices; planned at "
        f"{' '.join(realistic)} instead (set them to plan another batch)",
        file=sys.stderr,
    )
    overrides = [*overrides, *realistic]
    cfg, model, hardware = _compose(overrides)
    return cfg, overrides, _plan(cfg, model, hardware)


def print_commands(result, overrides: list[str], which: str, top: int) -> bool:
    """`--command`: the train.py command of the chosen row, of row N, or of every shown row.
    Return False when there is none to print."""
    if which == "all":
        for i, cand in enumerate(result.candidates[:top]):
            if cand.planner_only:
                print(f"# {i}: {cand.describe()}: planner only, no command ({cand.planner_only})")
            else:
                print(f"# {i}: {cand.describe()}\n{train_command(overrides, cand)}")
        return bool(result.candidates)
    if which == "chosen":
        if result.chosen is None:
            return False
        index = result.chosen
    elif which.isdigit() and int(which) < len(result.candidates):
        index = int(which)
    else:
        _fail(f"--command {which}: give a row number below {len(result.candidates)}, or all")
    if result.candidates[index].planner_only:
        _fail(
            f"--command {which}: row {index} is planner only, train.py cannot run it yet "
            f"({result.candidates[index].planner_only}); pick another row"
        )
    print(train_command(overrides, result.candidates[index]))
    return True


def dry_run_command(overrides: list[str]) -> int:
    """`--dry-run`: train.py's `plan.dry_run=true` on the same overrides, in a run directory
    that is removed afterwards; its exit status (2 with one line for a run it cannot build)."""
    import subprocess
    import tempfile

    _check_choices(overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        command = [
            sys.executable,
            "-m",
            "lightning_dist",
            *overrides,
            "plan.dry_run=true",
            f"hydra.run.dir={run_dir}",
        ]
        return subprocess.call(command)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m lightning_dist.plan`."""
    parser = argparse.ArgumentParser(
        prog="python -m lightning_dist.plan",
        description="Predict memory per device and step time of every layout; rank those that fit.",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for train.py")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument("--top", type=int, default=8, help="rows of the table (default 8)")
    parser.add_argument(
        "--details",
        action="store_true",
        help="memory by category (params, grads, optim, acts, buffers) too",
    )
    parser.add_argument(
        "--command",
        nargs="?",
        const="chosen",
        default=None,
        metavar="ROW",
        help="print only the `python train.py ...` command of the chosen layout "
        "(or of row ROW, or of every row with `all`)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="build the configured run at its full world size in this process "
        "(fake process group and tensors), run one step, and print each rank's "
        "bytes beside the planner's (as train.py plan.dry_run=true)",
    )
    ns = parser.parse_intermixed_args(argv)  # overrides before and after the flags
    if ns.dry_run:
        return dry_run_command(ns.overrides)
    cfg, model, hardware = _compose(ns.overrides)
    _check_strategy(cfg, ns.overrides)
    cfg, overrides, result = replan_at_a_realistic_batch(
        cfg, model, hardware, ns.overrides, _plan(cfg, model, hardware)
    )
    if ns.json:
        print(json.dumps(result.as_dict(), indent=1))
    elif ns.command:
        if not print_commands(result, overrides, ns.command, ns.top) and result.chosen is not None:
            return 1
    else:
        print_plan(result, cfg, model, hardware, ns.top, overrides=overrides, details=ns.details)
    if result.chosen is None:
        print(f"error: {result.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
