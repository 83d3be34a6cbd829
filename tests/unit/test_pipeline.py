"""Pipeline cutting, balancing, the layer protocol, global-norm clipping and the 3D strategy's
checks, in one process: stages of our model and of HF Llama, Qwen2 and Mistral keep their names
and compose to the whole model, and a meta stage materialises on its own. (Clipping over DTensor
pieces is tests/dist/test_pipeline_dist.py; the multi-process runs are
tests/dist/test_parallel3d_dist.py.)"""

import pytest
import torch
from torch import nn

from lightning_dist.layout import Layout
from lightning_dist.models.args import ModelArgs
from lightning_dist.models.hf import HFModelSpec
from lightning_dist.models.protocol import PipelineLayers
from lightning_dist.parallel.clip import clip_grad_norm_global
from lightning_dist.parallel.pipeline import balanced_split, cut_stage, split_blocks, stage_modules

DEBUG = ModelArgs(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=512, ffn_hidden_size=128)
HF = HFModelSpec(
    config=dict(
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=512,
        max_position_embeddings=64,
    ),
)


def test_balanced_split_minimises_the_largest_stage():
    assert balanced_split([1, 1, 1, 1], 2) == [2]
    assert balanced_split([5, 1, 1, 1, 1, 1], 2) == [1]  # a heavy first layer (the embedding)
    assert balanced_split([1, 1, 1, 1, 5], 3) == [2, 4]
    assert balanced_split([3, 3, 3], 3) == [1, 2]


def test_split_counts_embedding_and_output():
    # Tiny blocks and a big vocabulary: the embedding and output dominate, so the first and
    # last stages get fewer blocks than a plain layer count would give them.
    args = ModelArgs(dim=32, n_layers=8, n_heads=4, vocab_size=8192, ffn_hidden_size=32)
    with torch.device("meta"):
        stages = split_blocks(args.build(), 4)
    assert [len(s) for s in stages] == [1, 3, 3, 1]
    with torch.device("meta"):
        assert split_blocks(DEBUG.build(), 2) == [["0", "1"], ["2", "3"]]


def test_user_split_points_and_their_errors():
    with torch.device("meta"):
        model = DEBUG.build()
    assert split_blocks(model, 2, [1]) == [["0"], ["1", "2", "3"]]
    with pytest.raises(ValueError, match=r"split_points=\[1, 2\] must have 1 entries for 2 stages"):
        split_blocks(model, 2, [1, 2])
    with pytest.raises(ValueError, match="increasing layer indices between 1 and 3"):
        split_blocks(model, 3, [2, 2])
    with pytest.raises(ValueError, match="4 layers, fewer than the 8 pipeline stages"):
        split_blocks(model, 8)


def test_model_without_the_protocol():
    model = nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 8))
    assert not isinstance(model, PipelineLayers)
    with pytest.raises(ValueError, match="Sequential does not expose its layers for pipeline"):
        split_blocks(model, 2)


def _hf_build(model_type: str):
    from tests.unit.test_hf_archs import spec

    return spec(model_type).build


@pytest.mark.parametrize(
    "build",
    [DEBUG.build, HF.build, _hf_build("qwen2"), _hf_build("mistral")],
    ids=["llama", "hf_llama", "hf_qwen2", "hf_mistral"],
)
def test_stages_keep_names_and_compose_to_the_whole_model(build):
    torch.manual_seed(0)
    whole = build()
    names = dict(whole.named_parameters())
    tokens = torch.randint(0, 512, (2, 16))
    expected = whole(tokens)
    layout = Layout(pp=2, schedule="Interleaved1F1B", virtual_stages=2)  # 4 stages of 1 layer
    parts = {}
    for pp_rank in range(2):
        torch.manual_seed(0)
        parts.update(stage_modules(build(), layout, pp_rank))
    h = tokens
    for stage in range(4):
        for name, param in parts[stage].named_parameters():
            assert torch.equal(param, names[name]), f"stage {stage} renamed or changed {name}"
        h = parts[stage](h)
    torch.testing.assert_close(h, expected, rtol=1e-5, atol=1e-5)
    assert sum(p.numel() for s in parts.values() for p in s.parameters()) == sum(
        p.numel() for p in whole.parameters()
    )


def test_cut_stage_sets_the_foreign_ends_to_none():
    model = cut_stage(DEBUG.build(), ["2", "3"], first=False, last=True)
    assert model.tok_embeddings is None and model.output is not None
    assert list(model.layers.keys()) == ["2", "3"]
    h = model(torch.randn(1, 8, 64))
    assert h.shape == (1, 8, 512)


def test_global_norm_clipping_matches_torch_on_one_process():
    torch.manual_seed(0)
    a, b = nn.Linear(8, 8), nn.Linear(8, 8)
    b.load_state_dict(a.state_dict())
    for m in (a, b):
        m(torch.randn(4, 8)).square().sum().backward() if m is a else None
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        pb.grad = pa.grad.clone()
    expected = torch.nn.utils.clip_grad_norm_(a.parameters(), 0.1)
    norm = clip_grad_norm_global(b.parameters(), 0.1, stage_size=1)
    torch.testing.assert_close(norm, expected)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pb.grad, pa.grad)


# --- the strategy's checks, before any process exists -----------------------------------------


def _check(**strategy_kwargs):
    from lightning_dist.strategies.parallel3d import Parallel3DStrategy

    devices = strategy_kwargs.pop("devices", 4)
    model = strategy_kwargs.pop("model", DEBUG)
    batch = strategy_kwargs.pop("global_batch_size", 8)
    with torch.device("meta"):
        built = model.build()
    Parallel3DStrategy(**strategy_kwargs).check_run(
        devices=devices,
        num_nodes=1,
        precision="32-true",
        accelerator="cpu",
        model=built,
        global_batch_size=batch,
        micro_batch_size=None,
    )


def test_strategy_accepts_the_debug_layouts():
    _check(tp=2, pp=2, devices=8)
    _check(tp=2, sequence_parallel=True, devices=2)
    _check(pp=2, schedule="ZBVZeroBubble", virtual_stages=2, dp_shard=1, devices=2)
    _check(tp=2, model=HF, devices=4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tp=2, pp=2, dp_shard=1, devices=2), "multiply to 4, but the world size is 2"),
        (dict(tp=8, devices=8), "n_heads=4 is not divisible by tp=8"),
        (
            dict(pp=2, tp=2, global_batch_size=12, devices=8),
            "not divisible by dp=2 x microbatches=4",
        ),
        (dict(tp=2, split_points=[5], pp=2, devices=4), "increasing layer indices"),
        (
            dict(tp=2, sequence_parallel=True, model=HF, devices=2),
            "cannot run sequence parallelism",
        ),
        (dict(tp=2, tp_plan={"layers.*.mlp.w1": "colwise"}, devices=2), "matches no module"),
    ],
)
def test_strategy_rejects_bad_layouts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _check(**kwargs)


def test_registered_by_name_and_exported():
    import lightning.pytorch as pl  # noqa: F401  (loading Lightning registers our names)
    from lightning.pytorch.strategies import StrategyRegistry

    import lightning_dist

    assert "3d" in StrategyRegistry
    strategy = StrategyRegistry.get("3d")
    assert isinstance(strategy, lightning_dist.Parallel3DStrategy)
    assert strategy.layout.dp_shard == -1


def test_strategy_configs_compose_to_layouts(compose):
    from lightning_dist.config import hardware_spec
    from lightning_dist.run.plan import build_strategy, resolve_layout

    cases = {
        ("strategy=3d", "strategy.tp=2", "strategy.pp=2", "hardware.devices=8"):
            {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2},
        ("strategy=tp", "hardware.devices=4"): {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 4},
        ("strategy=pp", "hardware.devices=2"): {"pp": 2, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1},
    }  # fmt: skip
    for overrides, degrees in cases.items():
        cfg = compose(*overrides)
        strategy = build_strategy(cfg.strategy, hardware_spec(cfg))
        assert resolve_layout(strategy, cfg.hardware.devices).degrees() == degrees, overrides


@pytest.mark.parametrize("build", [DEBUG.build, HF.build], ids=["llama", "hf_llama"])
def test_a_meta_stage_materialises_on_its_own(build):
    """The init_sharded route: cut on meta, then allocate and initialise only the stage."""
    with torch.device("meta"):
        model = build()
    layout = Layout(pp=2)
    ((_, stage),) = stage_modules(model, layout, pp_rank=1)
    stage.to_empty(device="cpu")
    stage.init_weights()
    assert not any(t.is_meta for t in [*stage.parameters(), *stage.buffers()])
    out = stage(torch.randn(2, 8, 64))
    assert out.shape == (2, 8, 512) and torch.isfinite(out).all()


def test_sequence_parallel_is_on_under_tp_unless_turned_off(compose):
    """`strategy=3d strategy.tp=2` runs SP (auto); `=false` turns it off; a plan without norm
    entries (Hugging Face Llama) runs without it on auto and refuses an explicit true."""
    from lightning_dist.config import hardware_spec
    from lightning_dist.parallel.tp import uses_sequence_parallel
    from lightning_dist.run.plan import build_strategy

    def resolved(*overrides, model=DEBUG):
        cfg = compose("strategy=3d", "strategy.tp=2", "hardware.devices=2", *overrides)
        tp = build_strategy(cfg.strategy, hardware_spec(cfg)).options.tp
        with torch.device("meta"):
            return tp.sequence_parallel, uses_sequence_parallel(model.build(), tp.sequence_parallel)

    assert resolved() == ("auto", True)
    assert resolved("strategy.sequence_parallel=false") == (False, False)
    assert resolved("strategy.sequence_parallel=true") == (True, True)
    assert resolved(model=HF) == ("auto", False)
    with pytest.raises(Exception, match="strategy.sequence_parallel=.yes. must be auto, true or"):
        resolved("strategy.sequence_parallel=yes")
    from lightning_dist.options.knobs import TensorParallelOptions

    for bad in (1, 0, "true", None):  # 1 == True in Python: the check is on the type
        with pytest.raises(ValueError, match=f"strategy.sequence_parallel={bad!r} must be"):
            TensorParallelOptions(sequence_parallel=bad)
