"""The one builder of objects named by a config's `_target_`, with an allowlist.

A config (a YAML file, an override, a sweep) may only name classes and functions under the
prefixes allowed for its place: `strategy._target_` a strategy, `callbacks.<name>._target_` a
callback, and so on. The check runs over the whole composed config before anything is built, so
`strategy._target_=os.system` or `+callbacks.x._target_=builtins.print` stops with one line, and
a `_target_` where nothing is built from (`+optim._target_=...`) is refused too. The target's
module must match as well as its name, so `lightning_dist.run.loggers.os.system` does not slip
through an allowed prefix. Widening the list is for whoever runs the code, never for a config:
Python code calls `allow_targets`, and the environment variable `LIGHTNING_DIST_ALLOW_TARGETS`
(comma-separated prefixes, e.g. `mypkg.callbacks.`) widens every group for a `train.py` run.
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, ListConfig

from lightning_dist._compat import config_child, config_is_missing, config_is_none

ALLOWED_TARGETS: dict[str, list[str]] = {
    "model": ["lightning_dist.models."],
    "data": ["lightning_dist.lm.data."],
    "strategy": ["lightning_dist.strategies.", "lightning.pytorch.strategies."],
    "logger": ["lightning_dist.run.loggers.", "lightning.pytorch.loggers."],
    "callbacks": ["lightning_dist.callbacks.", "lightning.pytorch.callbacks."],
}
"""Where each config group's `_target_` (and any `_target_` nested inside it) may point."""

ALLOW_TARGETS_ENV = "LIGHTNING_DIST_ALLOW_TARGETS"


def allowed_prefixes(group: str) -> list[str]:
    """The prefixes `<group>._target_` may start with: the group's list and the environment's."""
    extra = [p.strip() for p in os.environ.get(ALLOW_TARGETS_ENV, "").split(",") if p.strip()]
    return ALLOWED_TARGETS[group] + [p for p in extra if p not in ALLOWED_TARGETS[group]]


def allow_targets(group: str, *prefixes: str) -> None:
    """Let `<group>._target_` name your own classes, e.g. `allow_targets("callbacks",
    "mypkg.callbacks.")`; call it from Python before `train(cfg)`."""
    allowed = ALLOWED_TARGETS[group]
    allowed.extend(p for p in prefixes if p not in allowed)


def _targets(node: Any, path: str):
    """(path, target) of every `_target_` in a config subtree."""
    if isinstance(node, DictConfig):
        if config_is_none(node) or config_is_missing(node):
            return
        for key in node:
            child = config_child(node, key)
            if key == "_target_":
                yield f"{path}._target_", node[key]
            elif isinstance(child, DictConfig | ListConfig):
                yield from _targets(child, f"{path}.{key}")
    elif isinstance(node, ListConfig) and not config_is_none(node):
        for i, child in enumerate(node):
            yield from _targets(child, f"{path}[{i}]")


def check_target(path: str, target: Any, group: str, *, load: bool = True) -> None:
    """Raise ValueError unless `target` names a class or function under `group`'s prefixes;
    `load=False` checks the name alone (imports nothing)."""
    allowed = allowed_prefixes(group)
    refusal = (
        f"{path}={target!r} is not allowed: a {group} target must start with one of "
        f"{', '.join(allowed)} (allow more with {ALLOW_TARGETS_ENV}=<prefix> or, from Python, "
        f"lightning_dist.config.targets.allow_targets({group!r}, ...))"
    )
    if not isinstance(target, str) or not target.startswith(tuple(allowed)):
        raise ValueError(refusal)
    if not load:
        return
    from hydra.utils import get_object

    try:
        found = get_object(target)
    except Exception as e:  # ImportError, AttributeError: Hydra words them well enough
        raise ValueError(f"{path}={target!r} cannot be imported: {e}".splitlines()[0]) from e
    # The object must be defined under an allowed prefix too: a name that merely passes through
    # an allowed module (`lightning_dist.run.loggers.os.system`) is still refused.
    module = getattr(found, "__module__", None) or ""
    if not callable(found) or not f"{module}.".startswith(tuple(allowed)):
        raise ValueError(refusal)


def check_targets(cfg: DictConfig, *, load: bool = True) -> None:
    """Every `_target_` in a composed training config is allowed for its place; one ValueError
    naming the first that is not."""
    for key in cfg:
        node = config_child(cfg, key)
        if key == "callbacks" and isinstance(node, DictConfig) and not config_is_none(node):
            for name in node:
                entry = config_child(node, name)
                if not isinstance(entry, DictConfig) or "_target_" not in entry:
                    if config_is_none(entry):
                        continue
                    raise ValueError(
                        f"callbacks.{name} must be a config with a _target_ (or null to switch "
                        f"it off); remove it with ~callbacks.{name}"
                    )
                for path, target in _targets(entry, f"callbacks.{name}"):
                    check_target(path, target, "callbacks", load=load)
            continue
        for path, target in _targets(node, str(key)):
            if key not in ALLOWED_TARGETS:
                raise ValueError(
                    f"{path} is set, but nothing is built from {key}; remove the override "
                    f"(only {', '.join(ALLOWED_TARGETS)} name a _target_)"
                )
            check_target(path, target, str(key), load=load)


def build(node: DictConfig, group: str, **kwargs: Any) -> Any:
    """Instantiate `node` (a config of `group`) after checking every `_target_` in it."""
    from hydra.utils import instantiate

    for path, target in _targets(node, group):
        check_target(path, target, group)
    return instantiate(node, **kwargs)


HYDRA_CALLABLE_KEYS = ("_target_", "()", "class")
"""Keys under `hydra.` that make Hydra itself import and call something: callbacks, logging
handlers, filters and formatters. Hydra acts on them before any of our code runs."""
HYDRA_SHELL_KEYS = ("hydra.launcher.setup", "hydra.launcher.teardown", "hydra.launcher.srun_args")
"""Keys of the Slurm launcher (conf/hydra/launcher/submitit_slurm.yaml) whose values become
lines or words of the job's shell script."""


def check_hydra_overrides(args: list[str]) -> None:
    """Refuse command-line overrides that would have Hydra run a callable (`hydra.callbacks.*`,
    `hydra.job_logging.handlers.x.class=...`) or the Slurm job run shell code
    (`hydra.launcher.setup`); Hydra's YAML files are code, the command line not."""
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue
        key = arg.split("=", 1)[0].lstrip("+~")
        if key.startswith("hydra.callbacks") or (
            key.startswith("hydra.") and key.rsplit(".", 1)[-1] in HYDRA_CALLABLE_KEYS
        ):
            raise ValueError(
                f"the override of {key} is refused: Hydra would import and run what it names "
                "before any check; put Hydra callbacks and logging classes in a config file"
            )
        if key.startswith(HYDRA_SHELL_KEYS):
            raise ValueError(
                f"the override of {key} is refused: it would be run as shell code in the Slurm "
                "job; put it in a launcher config file (conf/hydra/launcher/)"
            )
