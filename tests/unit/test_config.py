"""Composition of the real conf/: every group, every strategy x hardware pair, typed schemas."""

import pytest
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lightning_dist.config import choice_names, hardware_spec, model_spec
from lightning_dist.hardware import HardwareSpec
from lightning_dist.run.finish import run_config
from lightning_dist.run.plan import build_strategy

STRATEGIES = choice_names("strategy")
HARDWARE = choice_names("hardware")


def test_groups_have_choices():
    assert {"single", "ddp"} <= set(STRATEGIES)
    assert {"cpu", "gpu", "dgx_a100", "dgx_h100", "dgx_h200", "rtx4090_x4"} <= set(HARDWARE)
    assert {"llama_debug", "tiny", "llama3_405b", "hf_llama"} <= set(choice_names("model"))


@pytest.mark.parametrize("hardware", HARDWARE)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_hardware_pair_composes(compose, strategy, hardware):
    cfg = compose(f"strategy={strategy}", f"hardware={hardware}")
    spec = hardware_spec(cfg)
    assert isinstance(spec, HardwareSpec) and spec.name == hardware
    built = build_strategy(cfg.strategy, spec)
    assert built is not None
    if strategy == "ddp":
        assert built._process_group_backend == spec.backend


@pytest.mark.parametrize("name", choice_names("model"))
def test_every_model_instantiates(compose, name):
    spec = model_spec(compose(f"model={name}"))
    assert spec.num_params() > 0 and spec.vocab_size > 0


@pytest.mark.parametrize("name", choice_names("data"))
def test_every_data_config_instantiates(compose, name):
    cfg = compose(f"data={name}", "model=llama_debug")
    dm = instantiate(cfg.data, vocab_size=512)
    assert dm.global_batch_size == cfg.data.global_batch_size


@pytest.mark.parametrize("name", choice_names("logger"))
def test_every_logger_instantiates(compose, name, tmp_path):
    cfg = compose(f"logger={name}")
    logger = instantiate(cfg.logger) if cfg.logger else None
    assert (logger is None) == (name == "none")


def test_hardware_figures_have_units_and_values(compose):
    h100 = hardware_spec(compose("hardware=dgx_h100"))
    assert (h100.devices, h100.memory_gib, h100.peak_tflops_bf16) == (8, 80, 989)
    assert h100.peak_flops("bf16-mixed") == 989e12
    assert hardware_spec(compose("hardware=cpu")).peak_flops("32-true") is None


def test_misspelt_key_fails_at_compose(compose, tmp_path):
    with pytest.raises(ConfigCompositionException, match="dimm"):
        compose("model.dimm=3")
    with pytest.raises(ConfigCompositionException, match="global_batchsize"):
        compose("data.global_batchsize=3")
    # A user's own flavor file with a typo fails too: the schema, not the override parser, says no.
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text(
        "defaults:\n  - /schema_llama\n  - _self_\ndimm: 3\n"
    )
    with pytest.raises(ConfigCompositionException, match="dimm"):
        compose(f"hydra.searchpath=[file://{tmp_path}]", "model=mine")


def test_experiment_and_debug_compose(compose):
    cfg = compose("experiment=tiny_stdlib", "debug=fast")
    assert cfg.trainer.max_steps == 5 and cfg.data.seq_len == 32


def test_run_config_redacts_secrets(compose):
    from lightning_dist.layout import Layout
    from lightning_dist.run.loggers import REDACTED, redact

    assert redact({"a": {"api_key": "x", "n": 1}, "wandb_token": "y"}) == {
        "a": {"api_key": REDACTED, "n": 1},
        "wandb_token": REDACTED,
    }
    cfg = compose()
    logged = run_config(OmegaConf.to_container(cfg, resolve=True), Layout(dp_replicate=2))
    assert logged["layout"]["dp_replicate"] == 2
    assert OmegaConf.create(logged).model.dim == 256
