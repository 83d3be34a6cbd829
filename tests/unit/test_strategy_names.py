"""One name per strategy from the YAML to the registry, and the old names still working through
one alias table (`runtime/strategy_names.RENAMED`), each use printing one deprecation line."""

import pytest
from omegaconf import OmegaConf

from lightning_dist.config import compose_config
from lightning_dist.config.schemas import SCHEMAS
from lightning_dist.options import PRESETS
from lightning_dist.run.checks import check_config_text
from lightning_dist.runtime.strategy_names import RENAMED, STRATEGIES, current_name


def test_each_strategy_config_has_one_name_through_schema_preset_and_registry():
    for name in ("single", "ddp", "fsdp", "fsdp2", "3d", "ft_hsdp", "auto"):
        cfg = compose_config([f"strategy={name}", "paths.output_dir=."])
        assert cfg.strategy.name == name
        assert OmegaConf.get_type(cfg.strategy) is SCHEMAS[f"schema_{name}"]
        assert name in PRESETS
    # the registry: our name, but FSDP1's, whose `fsdp` is Lightning's own strategy
    assert set(STRATEGIES) == {"fsdp_tuned", "fsdp2", "3d", "ft_hsdp"}
    assert all(current_name(old) == new for old, new in RENAMED.items())


def test_an_old_schema_name_in_a_users_yaml_composes_with_one_deprecation_line(tmp_path, capsys):
    (tmp_path / "strategy").mkdir()
    (tmp_path / "strategy" / "mine.yaml").write_text(
        "defaults:\n  - /schema_parallel3d\n  - _self_\nname: mine\ntp: 2\n"
    )
    cfg = compose_config(
        [f"hydra.searchpath=[file://{tmp_path}]", "strategy=mine", "paths.output_dir=."]
    )
    check_config_text(cfg, choices={})
    assert cfg.strategy.tp == 2 and cfg.strategy.dp_shard == -1  # the 3d preset's fields
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "warning: deprecated: the strategy name 'schema_parallel3d' is now 'schema_3d'; "
        "the old one still works (runtime/strategy_names.RENAMED) but will go"
    ]


def test_the_old_registry_name_builds_the_strategy_with_one_deprecation_line(capsys):
    pytest.importorskip("lightning")
    from lightning.pytorch.strategies import StrategyRegistry

    from lightning_dist.strategies.parallel3d import Parallel3DStrategy

    assert StrategyRegistry["3d"]["strategy"] is Parallel3DStrategy
    strategy = StrategyRegistry.get("parallel3d")  # what Trainer(strategy="parallel3d") calls
    assert isinstance(strategy, Parallel3DStrategy) and strategy.strategy_name == "3d"
    assert "'parallel3d' is now '3d'" in capsys.readouterr().err
