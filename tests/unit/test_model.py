"""Unit tests of the single-device model, its flavors and the Hugging Face adapter."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from lightning_dist.config import CONF_DIR  # also registers the schemas the flavors extend
from lightning_dist.models import ModelArgs, Transformer
from lightning_dist.models.args import MoEArgs
from lightning_dist.models.llama import RMSNorm

LLAMA_FLAVORS = sorted(
    p.stem for p in (CONF_DIR / "model").glob("*.yaml") if not p.stem.startswith("hf_")
)


def load_flavor(name: str):
    """Compose just the model group, through its schema, and instantiate it."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(overrides=[f"+model={name}"])
    return instantiate(cfg.model)


def debug_args(**overrides) -> ModelArgs:
    args = load_flavor("llama_debug")
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def materialize(args: ModelArgs, seed: int = 0) -> Transformer:
    with torch.device("meta"):
        model = args.build()
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    model.init_weights()
    return model


def assert_causal(model: torch.nn.Module, vocab_size: int, seq_len: int = 16, t: int = 7):
    """Changing tokens after position t leaves the logits up to t unchanged."""
    tokens = torch.randint(0, vocab_size, (2, seq_len))
    changed = tokens.clone()
    changed[:, t + 1 :] = torch.randint(0, vocab_size, (2, seq_len - t - 1))
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


# --- Transformer ------------------------------------------------------------------------------


def test_forward_shape_and_module_names():
    args = debug_args()
    model = materialize(args)
    logits = model(torch.randint(0, args.vocab_size, (3, 17)))
    assert logits.shape == (3, 17, args.vocab_size)
    names = dict(model.named_modules())
    # Tensor-parallel plans and pipeline splits address modules by these names.
    for name in (
        "tok_embeddings",
        "layers.3.attention_norm",
        "layers.3.attention.wq",
        "layers.3.attention.wk",
        "layers.3.attention.wv",
        "layers.3.attention.wo",
        "layers.3.ffn_norm",
        "layers.3.feed_forward.w1",
        "layers.3.feed_forward.w2",
        "layers.3.feed_forward.w3",
        "norm",
        "output",
    ):
        assert name in names, name
    assert isinstance(model.layers, torch.nn.ModuleDict)
    assert model.layers["0"].attention.wk.weight.shape == (args.kv_heads * args.head_dim, args.dim)
    assert isinstance(model.norm, RMSNorm)
    assert {n for n, _ in model.named_buffers()} == {"rope_cos", "rope_sin"}
    assert "rope_cos" not in model.state_dict()


def test_causal_masking():
    torch.manual_seed(0)
    args = debug_args()
    assert_causal(materialize(args), args.vocab_size)


@pytest.mark.parametrize("flavor", LLAMA_FLAVORS)
def test_meta_build_allocates_nothing_and_counts_match(flavor):
    args = load_flavor(flavor)
    assert isinstance(args, ModelArgs | MoEArgs)
    with torch.device("meta"):
        model = args.build()
    tensors = [*model.parameters(), *model.buffers()]
    assert all(t.is_meta for t in tensors)
    assert args.num_params() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "flavor, billions, digits",
    [
        ("llama3_8b", 8.03, 2),
        ("llama3_70b", 70.6, 1),
        ("llama3_405b", 405.9, 1),
        ("llama3_1b", 1.24, 2),
        ("gpt2_small", 0.124, 3),
    ],
)
def test_published_parameter_counts(flavor, billions, digits):
    assert round(load_flavor(flavor).num_params() / 1e9, digits) == billions


def test_init_weights_is_deterministic_and_complete():
    args = debug_args()
    a, b, c = materialize(args, seed=3), materialize(args, seed=3), materialize(args, seed=4)
    for (name, pa), pb, pc in zip(
        a.named_parameters(), b.parameters(), c.parameters(), strict=True
    ):
        assert not pa.is_meta and torch.isfinite(pa).all(), name
        assert torch.equal(pa, pb), name
        if "norm" not in name:
            assert not torch.equal(pa, pc), name
    for (name, buf), other in zip(a.named_buffers(), b.buffers(), strict=True):
        assert not buf.is_meta and torch.isfinite(buf).all() and torch.equal(buf, other), name
    assert all(torch.equal(m.weight, torch.ones_like(m.weight)) for m in _norms(a))
    std = a.layers["0"].attention.wq.weight.std().item()
    assert abs(std - args.init_std) < 0.2 * args.init_std


def test_direct_build_equals_meta_route():
    # Single-process runs build on CPU, sharded runs on meta: same seed must give same weights.
    args = debug_args()
    torch.manual_seed(5)
    direct = args.build()
    meta = materialize(args, seed=5)
    for (name, p), q in zip(direct.state_dict().items(), meta.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def test_init_weights_resets_rope_and_norms():
    model = materialize(debug_args())
    rope = model.rope_cos.clone()
    model.rope_cos.fill_(7.0)
    model.norm.weight.data.fill_(3.0)
    model.init_weights()
    assert torch.equal(model.rope_cos, rope)
    assert torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))


def test_tied_embeddings_share_storage():
    args = debug_args(tie_embeddings=True)
    model = materialize(args)
    assert model.output.weight is model.tok_embeddings.weight
    assert model.output.weight.data_ptr() == model.tok_embeddings.weight.data_ptr()
    assert args.num_params() == sum(p.numel() for p in model.parameters())


def test_train_flops_match_flop_counter():
    args = debug_args()
    model = materialize(args)
    batch, seq_len = 2, args.max_seq_len
    tokens = torch.randint(0, args.vocab_size, (batch, seq_len))
    counter = FlopCounterMode(display=False)
    # The math backend runs attention as counted matmuls; the fused CPU kernel has no FLOP
    # formula registered in FlopCounterMode and would count as zero.
    with sdpa_kernel(SDPBackend.MATH), counter:
        model(tokens).sum().backward()
    measured = counter.get_total_flops() / (batch * seq_len)
    expected = args.train_flops_per_token(seq_len)
    assert measured == pytest.approx(expected, rel=0.05)


def test_pipeline_stage_without_embeddings_accepts_hidden_states():
    args = debug_args()
    with torch.device("meta"):
        model = args.build()
    # What a pipeline split does: keep the names, drop what this stage does not own.
    model.tok_embeddings = None
    del model.layers["0"], model.layers["1"]
    model.to_empty(device="cpu")
    model.init_weights()
    assert list(model.layers.keys()) == ["2", "3"]
    h = torch.randn(2, 9, args.dim)
    assert model(h).shape == (2, 9, args.vocab_size)
    model.norm, model.output = None, None
    assert model(h).shape == (2, 9, args.dim)


def test_rmsnorm_keeps_dtype_and_normalises():
    norm = RMSNorm(8, eps=1e-6)
    x = torch.randn(4, 8, dtype=torch.bfloat16) * 5
    y = norm(x)
    assert y.dtype == torch.bfloat16
    rms = y.float().pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones(4), atol=2e-2, rtol=0)


def _norms(model):
    return [m for m in model.modules() if isinstance(m, RMSNorm)]


# --- Hugging Face adapter ---------------------------------------------------------------------


@pytest.fixture
def hf_spec():
    pytest.importorskip("transformers", reason="HF adapter tests need the [hf] extra")
    return load_flavor("hf_llama")


def test_hf_forward_shape_and_counts(hf_spec):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = hf_spec.build()
    assert isinstance(model.hf_model, LlamaForCausalLM)
    assert model(torch.randint(0, hf_spec.vocab_size, (2, 11))).shape == (2, 11, 512)
    assert hf_spec.max_seq_len == 256
    n_params = sum(p.numel() for p in model.parameters())
    assert hf_spec.to_model_args().num_params() == n_params == hf_spec.num_params()
    assert hf_spec.train_flops_per_token(128) == hf_spec.to_model_args().train_flops_per_token(128)


def test_hf_tied_config_counts(hf_spec):
    from lightning_dist.models.hf import HFModelSpec

    spec = HFModelSpec(config={**hf_spec.config, "tie_word_embeddings": True})
    model = spec.build()
    assert model.hf_model.lm_head.weight is model.hf_model.model.embed_tokens.weight
    assert spec.num_params() == sum(p.numel() for p in model.parameters())


def test_hf_same_seed_same_weights_and_meta_route(hf_spec):
    torch.manual_seed(1)
    a = hf_spec.build()
    torch.manual_seed(1)
    b = hf_spec.build()
    with torch.device("meta"):
        c = hf_spec.build()
    assert all(p.is_meta for p in c.parameters())
    c.to_empty(device="cpu")
    torch.manual_seed(1)
    c.init_weights()
    sd_a, sd_b, sd_c = a.state_dict(), b.state_dict(), c.state_dict()
    for key in sd_a:
        assert torch.equal(sd_a[key], sd_b[key]) and torch.equal(sd_a[key], sd_c[key]), key
    inv_freq = c.hf_model.model.rotary_emb.inv_freq
    torch.testing.assert_close(inv_freq, a.hf_model.model.rotary_emb.inv_freq)
    torch.manual_seed(2)
    a.init_weights()  # a second call re-draws, despite HF's "already initialised" marks
    assert not torch.equal(a.hf_model.lm_head.weight, sd_b["hf_model.lm_head.weight"])


def test_hf_causal_masking(hf_spec):
    torch.manual_seed(0)
    assert_causal(hf_spec.build(), hf_spec.vocab_size)


def test_hf_pretrained_round_trip(hf_spec, tmp_path):
    from lightning_dist.models.hf import HFModelSpec

    torch.manual_seed(0)
    model = hf_spec.build().eval()
    model.hf_model.save_pretrained(tmp_path)
    spec = HFModelSpec(pretrained_path=str(tmp_path))
    assert spec.num_params() == hf_spec.num_params()
    torch.manual_seed(123)  # the checkpoint, not the RNG, must decide the weights
    loaded = spec.build().eval()
    tokens = torch.randint(0, hf_spec.vocab_size, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), model(tokens))


def test_hf_spec_errors(tmp_path):
    from lightning_dist.models.hf import HFModelSpec

    with pytest.raises(ValueError, match="exactly one"):
        HFModelSpec()
    with pytest.raises(ValueError, match="exactly one"):
        HFModelSpec(config={"hidden_size": 64}, pretrained_path=str(tmp_path))
    missing = tmp_path / "no_such_model"
    with pytest.raises(FileNotFoundError, match="no_such_model"):
        HFModelSpec(pretrained_path=str(missing))
