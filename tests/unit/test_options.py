"""Every knob of every option class (lightning_dist/options/) is declared once and documented, is
settable from each strategy preset that uses it, arrives in the strategy's `options`, and reaches
the planner, where it changes the prediction unless it is marked planner-irrelevant. Keywords and
options objects build the same strategy, whose signature and docstring show each knob. (That the
options reach `parallelize()` is tests/dist/test_options_dist.py.)

Each knob needs a row in VALUES (a non-default value, and the other knobs it needs to matter),
so a new knob fails here until it has one. The walk at the end covers every setting of every
config group (model, data, strategy, hardware, trainer, optim, paths, plan, the top level): each
declared in one place, with its doc there."""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest

from lightning_dist import options
from lightning_dist.config import choice_names, compose_config, hardware_spec, model_spec
from lightning_dist.layout import Batch
from lightning_dist.run.plan import build_strategy
from lightning_dist.run.preflight import estimate_run

# knob: (override value as typed, the parsed value the strategy keeps, context overrides)
VALUES = {
    "pp": ("2", 2, []),
    "dp_replicate": ("2", 2, []),
    "dp_shard": ("2", 2, ["strategy.tp=-1", "strategy.dp_shard=8"]),
    "cp": ("2", 2, []),
    "tp": ("2", 2, []),
    "ep": ("2", 2, ["model=moe_debug", "data.seq_len=256"]),  # a mixture of experts to split
    "schedule": ("GPipe", "GPipe", ["strategy.pp=2"]),
    "microbatches": ("8", 8, ["strategy.pp=2"]),
    "virtual_stages": (
        "2",
        2,
        ["strategy.pp=2", "strategy.schedule=Interleaved1F1B", "strategy.virtual_stages=4"],
    ),
    "reshard_after_forward": ("false", False, []),
    "prefetch_forward": ("2", 2, []),
    "prefetch_backward": ("2", 2, []),
    "init_sharded": ("true", True, []),
    "auto_wrap": ("[TransformerBlock]", ["TransformerBlock"], []),
    "cpu_offload": ("true", True, []),
    "param_dtype": ("fp32", "fp32", []),  # the GPU default follows bf16-mixed
    "reduce_dtype": ("bf16", "bf16", []),
    "tp_plan": ("{output: colwise}", {"output": "colwise"}, ["strategy.tp=2"]),
    "sequence_parallel": ("false", False, ["strategy.tp=2"]),  # on (auto) by default
    "loss_parallel": ("false", False, ["strategy.tp=2"]),
    "cp_mode": ("ulysses", "ulysses", ["strategy.cp=2"]),
    "split_points": ("[10]", [10], ["strategy.pp=2"]),
    "activation_checkpointing": ("op", "op", []),
    "compile": ("true", True, ["strategy.compile_backend=aot_eager"]),
    "compile_backend": ("aot_eager", "aot_eager", ["strategy.compile=true"]),
    "float8": ("rowwise", "rowwise", []),
    "float8_all_gather": ("true", True, ["strategy.float8=tensorwise"]),
    "process_group_backend": ("gloo", "gloo", []),
    "state_dict_type": ("full", "full", []),
    "sharding_strategy": ("FULL_SHARD", "FULL_SHARD", []),
    "hybrid_shard_size": ("4", 4, []),
    "forward_prefetch": ("false", False, []),
    "backward_prefetch": ("BACKWARD_POST", "BACKWARD_POST", []),
    "limit_all_gathers": ("false", False, ["strategy.sharding_strategy=FULL_SHARD"]),
    "buffer_dtype": ("bf16", "bf16", []),
    "use_orig_params": ("false", False, []),
    "sync_module_states": ("true", True, []),
    "find_unused_parameters": ("true", True, []),
    "gradient_as_bucket_view": ("false", False, []),
    "static_graph": ("true", True, []),
    "broadcast_buffers": ("true", True, []),
    "replica_groups": ("3", 3, []),
    "min_replica_groups": ("2", 2, []),
    "join_timeout_s": ("0.5", 0.5, []),
    "heartbeat_timeout_s": ("3", 3, []),
    "ft_timeout_s": ("30", 30, []),
    "dp_shares": ("[3,1]", [3, 1], []),
    "grad_compression": ("powersgd", "powersgd", []),
    "powersgd_rank": ("4", 4, ["strategy.grad_compression=powersgd"]),
    "powersgd_start_step": ("100", 100, ["strategy.grad_compression=powersgd"]),
    "diloco_inner_steps": ("8", 8, []),
    "diloco_outer_lr": ("1.0", 1.0, ["strategy.diloco_inner_steps=8"]),
    "diloco_outer_momentum": ("0.0", 0.0, ["strategy.diloco_inner_steps=8"]),
    "simulate_slowdown": ("{1:3}", {1: 3.0}, []),
    "simulate_flops": ("2e9", 2e9, ["strategy.simulate_slowdown=[1,2]"]),
    "simulate_delay_ms": ("200", 200.0, []),
    "shard_optimizer": ("true", True, []),  # its replicas: MESH_CONTEXT
}
MESH_CONTEXT = {"shard_optimizer": ["strategy.dp_shard=1", "strategy.dp_replicate=8"]}
"""The context a knob needs under a preset with a layout: ZeRO-1 shards over replicas only
(`ddp`'s ranks are all replicas)."""

BASE = ["model=llama3_8b", "hardware=dgx_h100", "data.global_batch_size=32", "data.seq_len=2048"]


@functools.cache
def _composed(overrides: tuple[str, ...]):
    """The composed config of `overrides`, once per distinct command in this module (a Hydra
    composition costs 0.15 s or more; the planner test's runs without a knob repeat one)."""
    return compose_config([*overrides, "paths.output_dir=."])


def _strategy(name: str, extra: list[str]):
    cfg = _composed((*BASE, f"strategy={name}", *extra))
    hw = hardware_spec(cfg)
    return cfg, hw, build_strategy(cfg.strategy, hw)


def _kept(strategy, knob: str):
    group = getattr(strategy.options, options.KNOB_GROUP[knob])
    value = getattr(group, knob)
    if knob == "dp_replicate" and strategy.options.replica_per_node:
        return None
    return value.setting if knob == "activation_checkpointing" else value


@functools.cache
def _presets() -> list[tuple[str, str]]:
    """(config name, preset) of every conf/strategy file but auto (whose layout the planner
    picks; its one knob is checked below)."""
    out = []
    for name in choice_names("strategy"):
        if name == "auto":
            continue
        target = _composed((f"strategy={name}",)).strategy._target_
        preset = {
            "single_device_strategy": "single",
            "DataParallelStrategy": "ddp",
            "TunedFSDPStrategy": "fsdp",
            "FSDP2Strategy": "fsdp2",
            "FTHSDPStrategy": "ft_hsdp",
        }.get(target.rsplit(".", 1)[-1], "3d")
        out.append((name, preset))
    return out


def test_every_knob_has_a_test_value_and_one_declaration():
    declared = [f.name for g in options.GROUPS for f in options.group_knobs(g)]
    assert len(declared) == len(set(declared))
    assert sorted(declared) == sorted(VALUES), "give each new knob a row in VALUES"
    for group in options.GROUPS:
        for f in options.group_knobs(group):
            assert options.knob_doc(group, f), f"{group}.{f.name} has no documentation"


def test_each_preset_schema_is_exactly_its_option_classes():
    for name, preset in _presets():
        cfg = _composed((f"strategy={name}",))
        keys = set(cfg.strategy) - {"name", "_target_"}
        groups = options.PRESETS[preset].groups
        assert keys == {f.name for g in groups for f in options.group_knobs(g)}, name


def _knob_overrides(name: str, group: str, knob: str) -> list[str]:
    """The command line that sets `knob` alone on preset `name`: its context, then its value."""
    typed, _, context = VALUES[knob]
    if name in ("tp", "pp") and group == "layout":  # free its -1 degree first
        context = [f"strategy.{name}=1", "strategy.dp_shard=-1", *context]
    return [*context, f"strategy.{knob}={typed}"]


def _kept_alone(name: str, group: str, knob: str):
    _, _, strategy = _strategy(name, _knob_overrides(name, group, knob))
    return _kept(strategy, knob)


def _settings(overrides: list[str]) -> dict[str, str]:
    """key -> value of a command line, the last one of a key winning (as in Hydra)."""
    return dict(o.split("=", 1) for o in overrides)


def _bundles(name: str, knobs: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The (group, knob)s of a preset packed into as few commands as their settings allow: a
    knob joins the first command that sets none of its keys to another value."""
    bundles: list[tuple[dict[str, str], list[tuple[str, str]]]] = []
    for group, knob in knobs:
        mine = _settings(_knob_overrides(name, group, knob))
        for settings, members in bundles:
            if all(settings.get(k, v) == v for k, v in mine.items()):
                settings.update(mine)
                members.append((group, knob))
                break
        else:
            bundles.append((mine, [(group, knob)]))
    return [members for _, members in bundles]


def _check_together(name: str, members: list[tuple[str, str]]) -> int:
    """Each knob of `members` arrives in the strategy built from one command that sets them all;
    a command that does not build is halved, and a knob whose value does not arrive there is
    checked in a command of its own. How many knobs were checked."""
    settings: dict[str, str] = {}
    for group, knob in members:
        settings.update(_settings(_knob_overrides(name, group, knob)))
    strategy = None
    if len(members) > 1:
        try:
            _, _, strategy = _strategy(name, [f"{k}={v}" for k, v in settings.items()])
        except Exception:  # noqa: BLE001 - these knobs do not build together: halve them
            half = len(members) // 2
            return _check_together(name, members[:half]) + _check_together(name, members[half:])
    for group, knob in members:
        parsed = VALUES[knob][1]
        if strategy is None or _kept(strategy, knob) != parsed:
            assert _kept_alone(name, group, knob) == parsed, (name, knob)
    return len(members)


def test_every_knob_is_settable_from_each_preset_and_reaches_the_strategy():
    """Each knob set on the command line of each preset arrives in the strategy. The knobs of a
    preset go in as few commands as their settings allow (a Hydra compose costs 0.15 s or more);
    a command that does not build is halved, and a knob whose value does not arrive in its
    shared command is checked in a command of its own."""
    checked = 0
    for name, preset in _presets():
        knobs = [
            (g, f.name) for g in options.PRESETS[preset].groups for f in options.group_knobs(g)
        ]
        checked += sum(_check_together(name, members) for members in _bundles(name, knobs))
    assert checked > 100


def test_the_auto_preset_takes_its_knob():
    cfg = compose_config(
        ["strategy=auto", "strategy.process_group_backend=gloo", "paths.output_dir=."]
    )
    assert cfg.strategy.process_group_backend == "gloo"


def _with_value(cfg, key: str, typed: str):
    """A copy of the composed `cfg` with `key=typed` applied as Hydra applies a command-line
    value override (its grammar parses `typed`, OmegaConf merges it in): one composition per
    context instead of one per knob (each 0.15 s or more)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    value = OverridesParser.create().parse_override(f"{key}={typed}").value()
    changed = copy.deepcopy(cfg)
    OmegaConf.update(changed, key, value, merge=True)
    return changed


@pytest.mark.parametrize("name", ["3d", "fsdp2", "fsdp", "ddp"])
def test_every_planner_knob_changes_the_prediction_and_the_others_say_why_not(name):
    """The pre-flight estimate reads the strategy's options; for each knob the planner models,
    the configured value changes the prediction (memory, time or layout) against the same run
    without it. (The value is set on the composed run as Hydra sets a command-line value,
    `_with_value`; that each knob's command line arrives in the strategy is the walk above.)"""
    preset = options.PRESETS[name]
    for group in preset.groups:
        for f in options.group_knobs(group):
            reason = options.planner_ignores(group, f.name)
            if reason is not None:
                assert len(reason) > 10, f.name
                continue
            typed, _, context = VALUES[f.name]
            if "layout" in preset.groups:
                context = [*context, *MESH_CONTEXT.get(f.name, [])]
            without = _composed((*BASE, f"strategy={name}", *context))
            predictions = []
            for cfg in (without, _with_value(without, f"strategy.{f.name}", typed)):
                hw = hardware_spec(cfg)
                strategy = build_strategy(cfg.strategy, hw)
                layout = strategy.layout_for(hw.resolved_devices(), hw.num_nodes)
                cand = estimate_run(
                    Batch.of_config(cfg.data), model_spec(cfg), hw, strategy, layout, "bf16-mixed"
                )
                assert cand.settings.options is strategy.options
                predictions.append((cand.describe(), cand.memory.total, cand.time.step_seconds))
            assert predictions[0] != predictions[1], (name, f.name)


def test_plain_lightning_keywords_and_options_objects_build_the_same(tmp_path):
    from lightning_dist.strategies.fsdp import TunedFSDPStrategy
    from lightning_dist.strategies.parallel3d import Parallel3DStrategy

    by_keyword = Parallel3DStrategy(tp=2, activation_checkpointing="op", prefetch_forward=2)
    by_options = Parallel3DStrategy(options=by_keyword.options)
    assert by_keyword.options == by_options.options
    assert by_keyword.options.checkpointing.activation_checkpointing.mode == "op"
    with pytest.raises(TypeError, match="has no knob 'sharding_strategy'"):
        Parallel3DStrategy(sharding_strategy="FULL_SHARD")
    with pytest.raises(TypeError, match="has no knob 'tp'"):
        TunedFSDPStrategy(tp=2)
    assert dataclasses.is_dataclass(by_keyword.options)


def test_each_strategy_shows_its_knobs_in_its_signature_and_docstring():
    import inspect

    from lightning_dist.strategies.ddp import DataParallelStrategy
    from lightning_dist.strategies.fsdp import TunedFSDPStrategy
    from lightning_dist.strategies.fsdp2 import FSDP2Strategy
    from lightning_dist.strategies.parallel3d import Parallel3DStrategy

    for cls in (Parallel3DStrategy, FSDP2Strategy, TunedFSDPStrategy, DataParallelStrategy):
        params = inspect.signature(cls).parameters
        spec = options.PRESETS[cls.preset]
        for group in spec.groups:
            for f in options.group_knobs(group):
                assert params[f.name].default == spec.default(f), (cls.__name__, f.name)
                assert f"    {f.name} = " in cls.__doc__, (cls.__name__, f.name)
    assert inspect.signature(FSDP2Strategy).parameters["dp_replicate"].default is None


def test_every_optimizer_setting_is_declared_once_and_reaches_the_module(tmp_path):
    """`optim.*`: the schema is the option class's fields (generated), each documented, and each
    set on the command line arrives in the LightningModule that builds the optimizer."""
    import dataclasses

    from lightning_dist.config.schemas import OptimSchema
    from lightning_dist.lm.module import CausalLM
    from lightning_dist.options.optim import OptimOptions
    from lightning_dist.run.spec import RunSpec

    values = {
        "lr": 1e-4,
        "min_lr_ratio": 0.25,
        "warmup_steps": 7,
        "weight_decay": 0.05,
        "betas": [0.8, 0.9],
        "eps": 1e-6,
    }
    declared = [f.name for f in dataclasses.fields(OptimOptions)]
    assert [f.name for f in dataclasses.fields(OptimSchema)] == declared == list(values)
    assert all(f.metadata["doc"] for f in dataclasses.fields(OptimOptions))
    overrides = [f"optim.{k}={v}".replace(" ", "") for k, v in values.items()]
    spec = RunSpec.of(compose_config([*overrides, f"paths.output_dir={tmp_path}"]), {})
    module = CausalLM(spec.model, optim=spec.optim)
    assert dataclasses.asdict(module.optim) == values
    with pytest.raises(ValueError, match=r"optim.betas=\[0.9\] must be two values"):
        OptimOptions(betas=[0.9])


RUN_SETTING_VALUES = {
    "trainer": {"max_steps": 7, "precision": "bf16-mixed", "gradient_clip_val": 0.5,
                "val_check_interval": 3, "log_every_n_steps": 2, "num_sanity_val_steps": 1,
                "enable_checkpointing": True, "ckpt_path": "/tmp/a.ckpt", "init_from": "/tmp/w",
                "resume": "auto", "collective_timeout_s": 30.0, "nan_policy": "skip",
                "nan_max_skips": 2, "gc_every_n_steps": 9, "memory_by_category_step": 0,
                "deterministic": True, "benchmark": True},
    "trainer.checkpoint": {"every_n_train_steps": 4, "dirpath": "/tmp/c", "save_last": True,
                           "keep_last": 1, "async_save": True},
    "plan": {"only": True, "check": False, "dry_run": True},
}  # fmt: skip
"""A value other than the default for every trainer, checkpoint-saving and plan setting."""


def test_every_run_setting_is_declared_once_and_reaches_the_run_spec(tmp_path):
    """`trainer.*`, `trainer.checkpoint.*` and `plan.*`: the schemas are their option classes'
    fields (generated), each documented, and each set on the command line arrives, typed, in the
    `RunSpec` the run reads (and the saving settings in `RunCheckpoints`)."""
    import dataclasses

    from lightning_dist.checkpoint.store import RunCheckpoints
    from lightning_dist.config import schemas
    from lightning_dist.options.saving import SaveOptions
    from lightning_dist.options.trainer import PlanOptions, TrainerOptions
    from lightning_dist.run.spec import RunSpec

    classes = {"trainer": (TrainerOptions, schemas.TrainerSchema),
               "trainer.checkpoint": (SaveOptions, schemas.CheckpointSchema),
               "plan": (PlanOptions, schemas.PlanSchema)}  # fmt: skip
    for section, (options_class, schema) in classes.items():
        declared = [f.name for f in dataclasses.fields(options_class)]
        assert [f.name for f in dataclasses.fields(schema)] == declared, section
        assert all(f.metadata["doc"] for f in dataclasses.fields(options_class)), section
        assert set(declared) - {"checkpoint"} == set(RUN_SETTING_VALUES[section]), section
    overrides = [
        f"{section}.{k}={v}"
        for section, values in RUN_SETTING_VALUES.items()
        for k, v in values.items()
    ]
    spec = RunSpec.of(compose_config([*overrides, f"paths.output_dir={tmp_path}"]), {})
    got = {
        "trainer": spec.trainer,
        "trainer.checkpoint": spec.trainer.checkpoint,
        "plan": spec.plan,
    }
    for section, values in RUN_SETTING_VALUES.items():
        assert type(got[section]) is classes[section][0]
        assert {k: getattr(got[section], k) for k in values} == values, section
    assert RunCheckpoints.of(spec.trainer, tmp_path).saving == spec.trainer.checkpoint


# --- every setting of every config group: declared once, documented there ----------------------

NOT_SCHEMA_GROUPS = {
    "logger": "its keys are the arguments of the logger its _target_ names (checked below)",
    "callbacks": "each entry's keys are the arguments of its _target_ (checked below)",
    "experiment": "a bundle of other groups' settings (@package _global_), typed by their schemas",
    "debug": "a bundle of other groups' settings (@package _global_), typed by their schemas",
}
"""The conf/ groups without a schema of their own, and why the walk has nothing to type there."""


@functools.cache
def _attribute_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a hand-written dataclass: the string under each field."""
    import ast
    import inspect
    import textwrap

    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
    except (OSError, TypeError):  # a generated class has no source
        return {}
    return {
        field.target.id: doc.value.value
        for field, doc in zip(body, body[1:], strict=False)
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
        and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
        and isinstance(doc.value.value, str)
    }  # fmt: skip


def _declaration(schema: type, f: dataclasses.Field) -> tuple[str, str | None]:
    """(where setting `f` of `schema` is declared, its doc there): the option class a generated
    schema copied it from (`declared_in`), else the class whose body annotates it."""
    import inspect

    owner = f.metadata.get("declared_in") or schema
    if inspect.isclass(owner):
        owner = next(c for c in owner.__mro__ if f.name in vars(c).get("__annotations__", {}))
    doc = f.metadata.get("doc")
    if doc is None and inspect.isclass(owner):
        doc = _attribute_docs(owner).get(f.name)
    return f"{owner.__module__}.{owner.__qualname__}", doc


def _walk(schema: type, prefix: str, found: dict[str, set]) -> None:
    """Every setting under `prefix` of `schema`, nested schemas (`trainer.checkpoint`) and
    lists of them (`data.sources[i]`) included, into `found`: path -> declarations."""
    import typing

    from lightning_dist.config import schemas

    hints = typing.get_type_hints(schema, vars(schemas))
    for f in dataclasses.fields(schema):
        if f.name == "_target_":  # Hydra's key: the class a group config builds
            continue
        kind, path = hints[f.name], prefix + f.name
        item = typing.get_args(kind)[0] if typing.get_origin(kind) is list else None
        if dataclasses.is_dataclass(item):
            _walk(item, f"{path}[i].", found)
        elif dataclasses.is_dataclass(kind):
            _walk(kind, f"{path}.", found)
        elif not (prefix == "" and kind is typing.Any):  # Any at the root: a group's schema
            found.setdefault(path, set()).add(_declaration(schema, f))


def _group_schemas() -> dict[str, set[type]]:
    """The schema each conf/<group>/*.yaml extends (`/schema_<name>` in its defaults list)."""
    from omegaconf import OmegaConf

    from lightning_dist.config import CONF_DIR
    from lightning_dist.config.schemas import SCHEMAS

    out: dict[str, set[type]] = {}
    for path in sorted(CONF_DIR.glob("*/*.yaml")):
        defaults = OmegaConf.load(path).get("defaults") or []
        for entry in defaults:
            if isinstance(entry, str) and entry.startswith("/schema_"):
                out.setdefault(path.parent.name, set()).add(SCHEMAS[entry[1:]])
    return out


def _declarations() -> dict[str, set]:
    from lightning_dist.config.schemas import TrainSchema

    found: dict[str, set] = {}
    _walk(TrainSchema, "", found)  # the top level, hardware, trainer, optim, paths, plan
    for group, group_schemas in _group_schemas().items():  # model, data, strategy
        for schema in group_schemas:
            _walk(schema, f"{group}.", found)
    return found


def test_every_setting_of_every_config_group_is_declared_once_with_its_doc():
    """The walk: every setting of every config group (the schema-typed sections of the composed
    config, and each group config's schema) is declared in one place, where its doc is: a
    setting two classes or schemas declare (a doc in each, or one without) fails, as does one
    without a doc. The groups without a schema are `NOT_SCHEMA_GROUPS`."""
    from lightning_dist.config import CONF_DIR
    from lightning_dist.config.schemas import RENAMED_SCHEMAS, SCHEMAS

    found = _declarations()
    twice = {path: sorted(places) for path, places in found.items() if len(places) > 1}
    assert not twice, f"declared in more than one place: {twice}"
    undocumented = sorted(path for path, places in found.items() if not any(d for _, d in places))
    assert not undocumented, f"no doc where declared: {undocumented}"
    typed = {path.split(".")[0] for path in found}  # hardware, trainer, model, data, ...
    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir() and any(p.glob("*.yaml"))}
    assert groups - set(NOT_SCHEMA_GROUPS) <= typed, groups - typed
    used = set().union(*_group_schemas().values())
    assert set(SCHEMAS.values()) - used <= set(RENAMED_SCHEMAS), "a schema no config extends"
    for path in ("data.seq_len", "data.per_rank_batch_size", "data.sources[i].weight",
                 "strategy.tp", "model.dim", "model.config", "hardware.devices",
                 "trainer.checkpoint.keep_last", "optim.lr", "plan.only", "seed"):  # fmt: skip
        assert path in found, path
    assert len(found) > 150


def test_the_walk_sees_a_setting_declared_twice():
    """A hand-written schema that declares a data setting again, with a doc of its own, is one
    declaration too many for the walk."""
    from lightning_dist.config.schemas import TextDataSchema

    @dataclasses.dataclass(kw_only=True)
    class RedeclaringSchema:
        seq_len: int = 64
        """Tokens per window (a second doc of data.seq_len)."""

    found: dict[str, set] = {}
    _walk(TextDataSchema, "data.", found)
    _walk(RedeclaringSchema, "data.", found)
    places = sorted(found["data.seq_len"])
    assert [p for p, _ in places] == [
        "lightning_dist.options.datamodules.BatchOptions",
        f"{__name__}.test_the_walk_sees_a_setting_declared_twice.<locals>.RedeclaringSchema",
    ]
    assert all(doc for _, doc in places)


def test_the_groups_without_a_schema_take_their_keys_as_their_targets_arguments():
    """logger and callbacks: each key of each config is an argument of the class or function its
    `_target_` names, which declares and documents it (there is no second declaration)."""
    import inspect

    from hydra.utils import get_object
    from omegaconf import OmegaConf

    from lightning_dist.config import CONF_DIR

    checked = 0
    for group in ("logger", "callbacks"):
        for path in sorted((CONF_DIR / group).glob("*.yaml")):
            cfg = OmegaConf.to_container(OmegaConf.load(path)) or {}
            entries = [cfg] if group == "logger" else list(cfg.values())
            for entry in entries:
                if not entry or "_target_" not in entry:
                    continue
                params = inspect.signature(get_object(entry["_target_"])).parameters
                unknown = set(entry) - {"_target_"} - set(params)
                assert not unknown, (path.name, entry["_target_"], unknown)
                checked += 1
    assert checked >= 6


DATA_SETTING_VALUES = {
    "seq_len": 64, "global_batch_size": 4, "per_rank_batch_size": 2, "micro_batch_size": 2,
    "val_batches": 2, "num_workers": 1, "seed": 7, "pack_documents": True, "num_samples": 40,
    "val_samples": 8,
}  # fmt: skip
"""A value other than the default for every setting of data=synthetic."""


def test_every_data_setting_is_declared_once_and_reaches_the_datamodule():
    """`data.*`: each data config's schema is its option classes' fields (generated, with the
    config's own defaults), the datamodule's signature is the same settings, and each setting
    set on the command line arrives in the datamodule's options."""
    import inspect

    from hydra.utils import get_object, instantiate

    from lightning_dist.config import schemas
    from lightning_dist.options.datamodules import DATA_CONFIGS, BatchOptions, SyntheticOptions

    for name, spec in DATA_CONFIGS.items():
        schema = schemas.SCHEMAS[f"schema_{name}"]
        declared = [f.name for _, f in spec.settings()]
        assert [f.name for f in dataclasses.fields(schema)] == ["_target_", *declared], name
        params = inspect.signature(get_object(spec.target)).parameters
        assert {k: params[k].default for k in declared} == {
            f.name: spec.default(f) for _, f in spec.settings()
        }, name
    assert set(DATA_SETTING_VALUES) == {f.name for _, f in DATA_CONFIGS["synthetic"].settings()}
    overrides = [f"data.{k}={v}" for k, v in DATA_SETTING_VALUES.items()]
    cfg = _composed(("data=synthetic", *overrides))
    dm = instantiate(cfg.data, vocab_size=512)
    got = {**dataclasses.asdict(dm.batch), "num_samples": dm.num_samples,
           "val_samples": dm.val_samples}  # fmt: skip
    assert got == DATA_SETTING_VALUES
    assert isinstance(dm.batch, BatchOptions) and dm.micro_batch_size == 2
    by_options = get_object(DATA_CONFIGS["synthetic"].target)(
        vocab_size=512, batch=dm.batch, synthetic=SyntheticOptions(num_samples=40, val_samples=8)
    )
    assert by_options.batch == dm.batch and by_options.val_samples == 8
    with pytest.raises(TypeError, match="has no setting 'tokenizer'; its settings are"):
        get_object(DATA_CONFIGS["synthetic"].target)(vocab_size=512, tokenizer="x")
    with pytest.raises(ValueError, match=r"data.seq_len=0 must be at least 1"):
        BatchOptions(seq_len=0)


def test_zero1_slices_evenly_and_takes_only_elementwise_optimizers():
    """`strategy.shard_optimizer`'s slices: ceil(N / dp) elements each, the last one padded;
    an optimizer whose update is not elementwise is refused before any collective."""
    import torch

    from lightning_dist.parallel.flat_shards import shard_bounds
    from lightning_dist.parallel.sharded_optimizer import ShardedOptimizer

    assert [shard_bounds(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert shard_bounds(8, 2, 1) == (4, 8)
    lbfgs = torch.optim.LBFGS([torch.nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match="shards elementwise optimizers .* not LBFGS"):
        ShardedOptimizer(lbfgs)
    # fp16's loss scaler would skip steps on each rank's unreduced gradients: refused at launch.
    from lightning_dist.strategies.ddp import DataParallelStrategy
    from lightning_dist.strategies.parallel3d import Parallel3DStrategy

    zero1 = DataParallelStrategy(shard_optimizer=True)
    with pytest.raises(ValueError, match="trainer.precision=16-mixed is not supported"):
        zero1.check_run(devices=2, num_nodes=1, precision="16-mixed", accelerator="gpu")
    mesh = Parallel3DStrategy(shard_optimizer=True, dp_shard=1, dp_replicate=2)  # its own check
    with pytest.raises(ValueError, match="trainer.precision=16-mixed is not supported"):
        mesh.check_run(devices=2, num_nodes=1, precision="16-mixed", accelerator="gpu")
    zero1.check_run(devices=2, num_nodes=1, precision="16-true", accelerator="gpu")  # no scaler
