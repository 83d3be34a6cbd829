"""Typed Hydra schemas, registered in the ConfigStore, and helpers to read a composed config.

Every YAML file in `conf/` extends one of these schemas through its defaults list, so a
misspelt key fails when the config is composed, before anything runs. This module stays light
(no Lightning import) because the planner CLI composes configs too.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from lightning_dist import options
from lightning_dist.config.resolvers import register_resolvers
from lightning_dist.hardware import HardwareSpec
from lightning_dist.models.args import HFModelSettings, ModelArgs, MoEArgs
from lightning_dist.options.data import DataSource
from lightning_dist.options.datamodules import DATA_CONFIGS
from lightning_dist.options.optim import OptimOptions
from lightning_dist.options.saving import SaveOptions
from lightning_dist.options.trainer import PlanOptions, TrainerOptions
from lightning_dist.runtime.strategy_names import RENAMED

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
"""The YAML configs: `lightning_dist/conf/`, package data (`CONF_MODULE` to Hydra)."""
CONF_MODULE = "lightning_dist.conf"
"""The configs as a Python package: Hydra's `pkg://lightning_dist.conf` search path."""


def _fields_of(
    cls: type, nested: dict[type, type] | None = None, defaults: dict[str, Any] | None = None
) -> list[tuple[str, Any, Any]]:
    """The fields of dataclass `cls` as `make_dataclass` takes them: the same names, types (a
    field's `hydra_type` where OmegaConf cannot hold the Python one) and defaults (`defaults`
    first, then a field's `hydra_default`, such as an interpolation); a field whose default is
    an option class of `nested`, or a list of one, gets that class's schema. Each keeps its
    metadata (the doc) and names `cls` as where it is declared (`declared_in`)."""
    nested = nested or {}
    out: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(cls):
        meta = {**f.metadata, "declared_in": cls}
        schema = nested.get(type(f.default))
        if schema is not None:
            out.append((f.name, schema, field(default_factory=schema, metadata=meta)))
            continue
        kind = f.metadata.get("hydra_type") or f.type
        if typing.get_origin(kind) is list and typing.get_args(kind)[0] in nested:
            kind = types.GenericAlias(list, (nested[typing.get_args(kind)[0]],))
        if defaults and f.name in defaults:
            default = field(default=defaults[f.name], metadata=meta)
        elif "hydra_default" in f.metadata:
            default = field(default=f.metadata["hydra_default"], metadata=meta)
        elif f.default_factory is not dataclasses.MISSING:
            default = field(default_factory=f.default_factory, metadata=meta)
        else:
            default = field(default=f.default, metadata=meta)
        out.append((f.name, kind, default))
    return out


def knob_schema(cls: type, name: str, nested: dict[type, type] | None = None) -> type:
    """The Hydra schema of an option class whose fields are `knob()`s, generated so that each
    setting is declared once, in its option class (see `_fields_of`)."""
    return dataclasses.make_dataclass(
        name, _fields_of(cls, nested), kw_only=True, namespace={"__module__": __name__}
    )


def _with_target(cls: type, target: str, name: str) -> type:
    """A schema dataclass: `_target_` followed by the fields of dataclass `cls`, importable as
    `lightning_dist.config.schemas.<name>`, so a config pickled to a Slurm job (the submitit launcher)
    finds its schema there instead of a copy without fields."""
    fields = [("_target_", str, field(default=target)), *_fields_of(cls)]
    return dataclasses.make_dataclass(
        name, fields, kw_only=True, namespace={"__module__": __name__}
    )


LlamaSchema = _with_target(ModelArgs, "lightning_dist.models.args.ModelArgs", "LlamaSchema")
MoESchema = _with_target(MoEArgs, "lightning_dist.models.args.MoEArgs", "MoESchema")


HFModelSchema = _with_target(
    HFModelSettings, "lightning_dist.models.hf.HFModelSpec", "HFModelSchema"
)


SourceSchema = knob_schema(DataSource, "SourceSchema")
"""One `data.sources` entry: the fields of `options.data.DataSource` (a misspelt key fails at
compose)."""


def _data_schema(config: str, name: str) -> type:
    """The Hydra schema of data config `config`: `_target_` and every setting of the option
    classes it uses (options/datamodules.DATA_CONFIGS), with its defaults; see `_with_target`
    for why it is importable by `name`."""
    spec = DATA_CONFIGS[config]
    fields = [("_target_", str, field(default=spec.target))]
    for cls in spec.groups.values():
        fields += _fields_of(cls, {DataSource: SourceSchema}, spec.defaults)
    return dataclasses.make_dataclass(
        name, fields, kw_only=True, namespace={"__module__": __name__}
    )


TextDataSchema = _data_schema("text", "TextDataSchema")
MixtureDataSchema = _data_schema("mixture", "MixtureDataSchema")
SyntheticDataSchema = _data_schema("synthetic", "SyntheticDataSchema")


_STRATEGY_NAME_DOC = "The strategy preset's name (summary.json's `strategy`), set by its schema."


def _strategy_schema(preset: str, target: str, name: str, schema: str) -> type:
    """The Hydra schema of a strategy: `name`, `_target_` and every knob of the option classes
    its preset uses (lightning_dist/options/), with the preset's defaults. Generated, so a
    knob is declared once; importable as `lightning_dist.config.schemas.<schema>` (see `_with_target`)."""
    spec = options.PRESETS[preset]
    fields: list[tuple[str, Any, Any]] = [
        (
            "name",
            str,
            field(
                default=name, metadata={"doc": _STRATEGY_NAME_DOC, "declared_in": _strategy_schema}
            ),
        ),
        ("_target_", str, field(default=target)),
    ]
    for group in spec.groups:
        hints = typing.get_type_hints(options.GROUPS[group])
        for f in options.group_knobs(group):
            kind = f.metadata.get("hydra_type") or hints[f.name]
            if group == "layout":  # -1 / null mean "the remaining ranks" / "one per node"
                kind = int | None if f.name == "dp_replicate" else kind
            default = spec.default(f)
            meta = {**f.metadata, "declared_in": options.GROUPS[group]}
            wrapped = (
                field(default_factory=lambda d=default: type(d)(d), metadata=meta)
                if isinstance(default, list | dict)
                else field(default=default, metadata=meta)
            )
            fields.append((f.name, kind, wrapped))
    return dataclasses.make_dataclass(
        schema, fields, kw_only=True, namespace={"__module__": __name__}
    )


_STRATEGIES = "lightning_dist.strategies."
SingleSchema = _strategy_schema(
    "single", _STRATEGIES + "single.single_device_strategy", "single", "SingleSchema"
)
DDPSchema = _strategy_schema("ddp", _STRATEGIES + "ddp.DataParallelStrategy", "ddp", "DDPSchema")
FSDPSchema = _strategy_schema("fsdp", _STRATEGIES + "fsdp.TunedFSDPStrategy", "fsdp", "FSDPSchema")
FSDP2Schema = _strategy_schema("fsdp2", _STRATEGIES + "fsdp2.FSDP2Strategy", "fsdp2", "FSDP2Schema")
Parallel3DSchema = _strategy_schema(
    "3d", _STRATEGIES + "parallel3d.Parallel3DStrategy", "3d", "Parallel3DSchema"
)
FTHSDPSchema = _strategy_schema(
    "ft_hsdp", _STRATEGIES + "ft_hsdp.FTHSDPStrategy", "ft_hsdp", "FTHSDPSchema"
)
AutoSchema = _strategy_schema(
    "auto", _STRATEGIES + "parallel3d.Parallel3DStrategy", "auto", "AutoSchema"
)


OptimSchema = knob_schema(OptimOptions, "OptimSchema")
"""`optim.*`: the fields of `options.optim.OptimOptions`."""


CheckpointSchema = knob_schema(SaveOptions, "CheckpointSchema")
"""`trainer.checkpoint.*`: the fields of `options.saving.SaveOptions`."""


TrainerSchema = knob_schema(TrainerOptions, "TrainerSchema", {SaveOptions: CheckpointSchema})
"""`trainer.*`: the fields of `options.trainer.TrainerOptions`."""
PlanSchema = knob_schema(PlanOptions, "PlanSchema")
"""`plan.*`: the fields of `options.trainer.PlanOptions`."""


@dataclass(kw_only=True)
class PathsSchema:
    output_dir: str = "${hydra:runtime.output_dir}"
    """The run directory; summary.json, logs and checkpoints go here."""
    private: bool = True
    """Create the run directory, checkpoints and logs readable by the owner only (0700/0600);
    false keeps the umask."""


@dataclass(kw_only=True)
class TrainSchema:
    model: Any = None
    data: Any = None
    strategy: Any = None
    hardware: HardwareSpec = field(default_factory=HardwareSpec)
    # The generated schemas are classes made at import time, which mypy cannot take as types.
    trainer: TrainerSchema = field(default_factory=TrainerSchema)  # type: ignore[valid-type]
    optim: OptimSchema = field(default_factory=OptimSchema)  # type: ignore[valid-type]
    logger: Any = None
    callbacks: Any = None
    paths: PathsSchema = field(default_factory=PathsSchema)
    plan: PlanSchema = field(default_factory=PlanSchema)  # type: ignore[valid-type]
    experiment: Any = None
    debug: Any = None
    seed: int = 1234
    """Seeds the run (Lightning's `seed_everything`, the model's initial weights) and, unless
    set itself, `data.seed` (the order of the samples)."""
    run_name: str | None = None
    """The run's name, in the logger too; its home is outputs/<run name> (`hydra.run.dir`).
    null: <model>-<strategy>-<hardware> from the config choices (`config/resolvers.run_name`)."""
    project: str = "lightning_dist"
    """W&B project (and CSV/TensorBoard sub-folder)."""
    report: bool = True
    """At the end of a run, write <run dir>/report/ (loss, memory and comm/compute plots and a
    README.md; `python -m lightning_dist.report`), a few seconds on rank 0; false skips it."""


def register_schemas() -> None:
    """Register every schema; idempotent, so tests and CLIs may call it freely.

    The group schemas are stored at the root, not in their group: `conf/strategy/ddp.yaml`
    extends `/schema_ddp`, and `strategy=schema_ddp` does not exist, so a schema can neither be
    picked nor listed among a group's choices (`--help`).
    """
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainSchema)
    for name, node in SCHEMAS.items():
        cs.store(name=name, node=node)


SCHEMAS: dict[str, type] = {
    "schema_llama": LlamaSchema,
    "schema_moe": MoESchema,
    "schema_hf": HFModelSchema,
    "schema_text": TextDataSchema,
    "schema_mixture": MixtureDataSchema,
    "schema_synthetic": SyntheticDataSchema,
    "schema_single": SingleSchema,
    "schema_ddp": DDPSchema,
    "schema_auto": AutoSchema,
    "schema_fsdp": FSDPSchema,
    "schema_fsdp2": FSDP2Schema,
    "schema_3d": Parallel3DSchema,
    "schema_ft_hsdp": FTHSDPSchema,
}
"""Each group config's schema, by the name its YAML's defaults list gives (`/schema_<name>`)."""

RENAMED_SCHEMAS: dict[type, str] = {}
"""The old schema names of `runtime/strategy_names.RENAMED` (`/schema_parallel3d` in a user's
YAML), each a subclass of its new schema with the same fields, by the old name: a config composed
with one prints a deprecation line (`run.checks.check_config_text`)."""
for _old, _new in RENAMED.items():
    if _old.startswith("schema_"):
        _schema = dataclasses.make_dataclass(
            f"Renamed_{_old}",
            [],
            bases=(SCHEMAS[_new],),
            kw_only=True,
            namespace={"__module__": __name__},
        )
        globals()[_schema.__name__] = _schema  # importable by name, as `_with_target` says why
        RENAMED_SCHEMAS[_schema] = _old
        SCHEMAS[_old] = _schema


register_schemas()
register_resolvers()  # conf/train.yaml's run home; conf/hydra/launcher/submitit_slurm.yaml


def compose_config(overrides: list[str] | None = None, config_name: str = "train") -> DictConfig:
    """Compose `conf/<config_name>.yaml` with Hydra overrides, outside of `@hydra.main`.

    `paths.output_dir` must be overridden (or resolved by the caller) since no Hydra run
    directory exists here.
    """
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module=CONF_MODULE, version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides or []))


def model_spec(cfg: DictConfig):
    """The model description: `ModelArgs`, `MoEArgs`, or `HFModelSpec` for Hugging Face models."""
    from lightning_dist.config.targets import build

    return build(cfg.model, "model", _convert_="all")


def hardware_spec(cfg: DictConfig) -> HardwareSpec:
    return HardwareSpec(**OmegaConf.to_container(cfg.hardware, resolve=True))


def choice_names(group: str) -> list[str]:
    """The selectable config names of a group (the YAML files in conf/<group>/)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
