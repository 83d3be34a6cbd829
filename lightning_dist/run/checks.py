"""Checks of a composed training config that need no model and no process: keys, targets,
internal schemas, numbers, precision and what this machine can hold.

Each raises one ValueError naming the bad value and the fix; `train()` turns it into the one
line `error: ...` (exit 2) on every rank, before step 1. Warnings are one `warning: ...` line on
stderr, from the first process only.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lightning_dist._compat import config_child, config_is_none
from lightning_dist.config.schemas import RENAMED_SCHEMAS, TrainSchema
from lightning_dist.config.targets import check_targets
from lightning_dist.contract import contract_of
from lightning_dist.options.datamodules import BatchOptions
from lightning_dist.options.knobs import options_of
from lightning_dist.options.optim import OptimOptions
from lightning_dist.runtime.console import warn_once
from lightning_dist.runtime.strategy_names import deprecation_line

BYTES_PER_CPU_RANK = 0.5 * 2**30
"""What one CPU process takes before the model: Python, torch, Lightning, gloo buffers."""
CPU_RANKS_PER_CORE = 8
"""How far CPU ranks may oversubscribe the cores (the tests run 8 gloo ranks on 2 cores)."""
MIN_CPU_RANK_LIMIT = 8
STATE_BYTES_PER_PARAM = 16
"""fp32 weights, gradients and AdamW's two moments."""


def check_keys(cfg: DictConfig, path: str = "") -> None:
    """Every key of a typed node is a field of its schema. Hydra refuses `model.dimm=3` itself,
    but `+foo=1` adds any key; here that fails too. Values are never echoed (they may be
    secrets)."""
    schema = OmegaConf.get_type(cfg)
    if dataclasses.is_dataclass(schema):
        fields = [f.name for f in dataclasses.fields(schema)]
        for key in cfg:
            if key not in fields:
                where = f"{path}.{key}" if path else str(key)
                owner = path or "the top level"
                raise ValueError(
                    f"unknown config key {where}: {owner} takes {', '.join(fields)}; "
                    f"check the spelling, or drop the override of {where}"
                )
    for key in cfg:
        child = config_child(cfg, key)
        if isinstance(child, DictConfig) and not config_is_none(child):
            check_keys(child, f"{path}.{key}" if path else str(key))


def check_choices(choices: dict[str, Any]) -> None:
    """No config group is set to an internal schema (`strategy=schema_ddp`)."""
    from lightning_dist.config import choice_names

    for group, choice in choices.items():
        if isinstance(choice, str) and choice.startswith("schema_") and "/" not in group:
            valid = ", ".join(choice_names(group))
            raise ValueError(
                f"{group}={choice} is an internal schema, not a config; choose one of: {valid}"
            )


def _at_least(low: float, *, optional: bool = False, strict: bool = False):
    def ok(v):
        return (optional and v is None) or (v is not None and (v > low if strict else v >= low))

    return ok


NUMBER_RULES = [
    ("trainer.max_steps", _at_least(1), "at least 1 (the optimizer steps to train)"),
    ("trainer.log_every_n_steps", _at_least(1), "at least 1"),
    ("trainer.val_check_interval", _at_least(1, optional=True), "at least 1, or null"),
    ("trainer.gradient_clip_val", _at_least(0, optional=True), "0 or more, or null"),
    ("trainer.checkpoint.every_n_train_steps", _at_least(1, optional=True), "at least 1, or null"),
    ("trainer.gc_every_n_steps", _at_least(0), "0 (Python's own collection) or more"),
    ("trainer.memory_by_category_step", _at_least(0), "0 (not measured) or more"),
]  # fmt: skip
"""(key, test, what the value must be) for the numbers of a training config."""


def check_numbers(cfg: DictConfig) -> None:
    """The numbers of the trainer, batch and optimizer are in range; `optim.lr=0` only warns."""
    for key, ok, requirement in NUMBER_RULES:
        value = OmegaConf.select(cfg, key)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value)
        if not ok(value):
            raise ValueError(f"{key}={value} must be {requirement}")
    options_of(OptimOptions, cfg.optim)  # ValueError naming optim.<field>
    options_of(BatchOptions, cfg.data)  # data.<field>: the planner CLI's too, not its own words
    if cfg.optim.lr == 0:
        warn_once("optim.lr=0: the weights will not change; set optim.lr above 0 to train")


def check_config(cfg: DictConfig, choices: dict[str, Any] | None = None) -> None:
    """Every check of a composed config that needs nothing built."""
    check_config_text(cfg, choices)
    check_targets(cfg)
    check_target_arguments(cfg)


def check_target_arguments(cfg: DictConfig) -> None:
    """Every key of the logger's and each callback's config is an argument of its `_target_`.
    These groups have no schema, so `+logger.grup=x` composes, and Hydra would pass the key on
    as an argument: a TypeError once the run has started. (A target that takes `**kwargs`, such
    as Lightning's WandbLogger, takes any key.)"""
    import inspect

    from hydra.utils import get_object

    nodes = [("logger", config_child(cfg, "logger"))]
    callbacks = config_child(cfg, "callbacks")
    if isinstance(callbacks, DictConfig) and not config_is_none(callbacks):
        nodes += [(f"callbacks.{name}", config_child(callbacks, name)) for name in callbacks]
    for path, node in nodes:
        if not isinstance(node, DictConfig) or config_is_none(node) or "_target_" not in node:
            continue
        try:
            parameters = inspect.signature(get_object(node._target_)).parameters.values()
        except (TypeError, ValueError):  # a callable without a signature Python can read
            continue
        if any(p.kind is p.VAR_KEYWORD for p in parameters):
            continue
        names = [p.name for p in parameters if p.kind is not p.VAR_POSITIONAL]
        for key in node:
            if key not in names and not (key.startswith("_") and key.endswith("_")):
                raise ValueError(
                    f"unknown config key {path}.{key}: {node._target_} takes "
                    f"{', '.join(names)}; check the spelling, or drop the override of {path}.{key}"
                )


def check_config_text(cfg: DictConfig, choices: dict[str, Any] | None = None) -> None:
    """The checks that import nothing a config names (no torch, no Lightning): the schema,
    the `_target_` names, the keys, the group choices and the numbers; `check_config` adds
    importing each `_target_`."""
    if OmegaConf.get_type(cfg) is not TrainSchema:
        raise ValueError("this is not a training config; run train.py with --config-name=train")
    if choices is None:
        from hydra.core.hydra_config import HydraConfig

        choices = dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else {}
    renamed = RENAMED_SCHEMAS.get(OmegaConf.get_type(cfg.strategy))  # type: ignore[arg-type]
    if renamed:
        warn_once(deprecation_line(renamed))
    check_targets(cfg, load=False)
    check_keys(cfg)
    check_choices(choices)
    check_numbers(cfg)


def resolve_precision(precision: str, accelerator: str) -> str:
    """The precision that runs. CPUs have no fp16 autocast, so `16-mixed` (or `16-true`) on a
    CPU is refused in one line rather than run as bf16-mixed: that is what Lightning would
    substitute, but a run asked for fp16 would then train and record numbers of another format
    (8 bits of mantissa instead of 11, no loss scaling)."""
    if accelerator == "cpu" and str(precision) in ("16-mixed", "16", "16-true"):
        raise ValueError(
            f"trainer.precision={precision}: CPUs have no fp16 autocast; set "
            "trainer.precision=bf16-mixed (what Lightning would run instead) or 32-true"
        )
    return str(precision)


def cpu_count() -> int:
    """Cores this process may run on (its affinity, where the OS tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def memory_bytes() -> int:
    """Physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_cpu_capacity(
    devices: int, num_params: int, *, cores: int | None = None, memory: int | None = None
) -> None:
    """A CPU run's processes fit this machine: at most `CPU_RANKS_PER_CORE` per core, and their
    memory (a base per process plus one full copy of the model states) under physical memory."""
    cores = cores or cpu_count()
    memory = memory or memory_bytes()
    limit = max(MIN_CPU_RANK_LIMIT, CPU_RANKS_PER_CORE * cores)
    gib = 2**30
    if devices > limit:
        raise ValueError(
            f"hardware.devices={devices} starts {devices} CPU processes, but this machine has "
            f"{cores} cores (at most {limit} processes, {CPU_RANKS_PER_CORE} per core); lower "
            "hardware.devices"
        )
    need = devices * BYTES_PER_CPU_RANK + STATE_BYTES_PER_PARAM * num_params
    if need > memory:
        raise ValueError(
            f"hardware.devices={devices} CPU processes need about {need / gib:.1f} GiB "
            f"({BYTES_PER_CPU_RANK / gib:.1f} GiB each plus {STATE_BYTES_PER_PARAM * num_params / gib:.1f} "
            f"GiB of model states), but this machine has {memory / gib:.1f} GiB; lower "
            "hardware.devices or pick a smaller model"
        )


def _cluster_launch() -> bool:
    """True when an external launcher (torchrun, SLURM) started this process."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "SLURM_NTASKS" in os.environ


def check_machine(plan: Any) -> None:
    """Checks of the planned run (a `run.plan.RunPlan`) against this machine and launch
    (skipped by `plan.only`, which runs anywhere)."""
    plan.hardware.check_machine()
    contract_of(plan.strategy).check_environment()
    if plan.hardware.num_nodes > 1 and not _cluster_launch():
        raise ValueError(
            f"hardware.num_nodes={plan.hardware.num_nodes} needs every node started by torchrun "
            "or SLURM (see docs/LAUNCH.md); on one machine use hardware.num_nodes=1."
        )
    seq_len, max_seq_len = plan.batch.seq_len, plan.model.max_seq_len
    if seq_len > max_seq_len:
        raise ValueError(
            f"data.seq_len={seq_len} is above the model's maximum {max_seq_len}; lower "
            "data.seq_len or raise model.max_seq_len."
        )
