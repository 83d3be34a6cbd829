"""Weights of our `Transformer` <-> a Hugging Face Llama-family model, name by name; of our
`MoETransformer` <-> `MixtralForCausalLM`.

Our rotary embedding rotates consecutive pairs of a head's features (x[2i], x[2i+1]), as Meta's
reference code does; Hugging Face rotates the two halves (x[i], x[i + head_dim / 2]). The same
model in both therefore differs only in the order of the output rows of each head of the query
and key projections, and `to_hf`/`from_hf` reorder them. Everything else is a rename, but for
Mixtral's experts: our 3-D `experts.w1/w3/w2` [num_experts, out, in] are its per-expert
`block_sparse_moe.experts.<e>.w1/w3/w2.weight`, the names of the files that transformers writes
and reads (5.x fuses them in memory, as `mlp.experts.gate_up_proj` [E, 2 x hidden, dim], w1's
rows first, and `down_proj`, which import reads too).

Only architectures our model can represent exactly are accepted: Llama, Mistral and Mixtral (no
biases, no rotary scaling). Qwen2 has q/k/v biases, Qwen2-MoE a gated shared expert, Qwen3-MoE
norms on the queries and keys, none of which our model has; train them with `model=hf_llama
model.pretrained_path=<dir>` instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from lightning_dist.models.args import ModelArgs, MoEArgs
from lightning_dist.models.hf import IMPORTABLE_MODEL_TYPES as SUPPORTED_MODEL_TYPES
from lightning_dist.models.hf import NOT_IMPORTABLE as UNREPRESENTABLE
from lightning_dist.models.hf import HFModelSpec

# Per layer: our name -> Hugging Face name (both relative to the layer).
LAYER_NAMES = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
ROUTER_BIAS = "feed_forward.router.expert_bias"
"""Our router's balancing bias (`MoEShape.bias_update_rate`), which Mixtral has not: zero on
import, and export refuses one that training moved."""
MOE_LAYER_NAMES = {"feed_forward.router.gate.weight": "block_sparse_moe.gate.weight"}
EXPERTS = {
    "feed_forward.experts.w1": "w1",
    "feed_forward.experts.w3": "w3",
    "feed_forward.experts.w2": "w2",
}
"""Our 3-D expert weights -> the name of expert e's slice in Mixtral, `...experts.<e>.<w>.weight`."""
TOP_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(name: str) -> str:
    """Our parameter name -> the Hugging Face one (`layers.3.attention.wq.weight` ->
    `model.layers.3.self_attn.q_proj.weight`)."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    _, index, rest = name.split(".", 2)
    return f"model.layers.{index}.{LAYER_NAMES.get(rest) or MOE_LAYER_NAMES[rest]}"


def expert_names(name: str, num_experts: int) -> list[str]:
    """The Hugging Face names of the slices of our 3-D expert weight `name`
    (`layers.1.feed_forward.experts.w1` -> `model.layers.1.block_sparse_moe.experts.<e>.w1.weight`
    for each expert e), or [] when `name` is no expert weight."""
    _, index, rest = name.split(".", 2) if name.startswith("layers.") else ("", "", name)
    if rest not in EXPERTS:
        return []
    prefix = f"model.layers.{index}.block_sparse_moe.experts"
    return [f"{prefix}.{e}.{EXPERTS[rest]}.weight" for e in range(num_experts)]


def _unfuse_experts(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5.x's in-memory Mixtral names (`mlp.gate`, fused `mlp.experts.gate_up_proj`
    and `down_proj`) -> those of its files (`block_sparse_moe.*`, per expert)."""
    out = {}
    for key, tensor in hf_state.items():
        prefix, _, rest = key.partition(".mlp.")
        if rest == "gate.weight":
            out[f"{prefix}.block_sparse_moe.gate.weight"] = tensor
        elif rest in ("experts.gate_up_proj", "experts.down_proj"):
            if rest.endswith("gate_up_proj"):
                parts = dict(zip(("w1", "w3"), tensor.chunk(2, dim=1), strict=True))
            else:
                parts = {"w2": tensor}
            for w, part in parts.items():
                for e, piece in enumerate(part):
                    out[f"{prefix}.block_sparse_moe.experts.{e}.{w}.weight"] = piece
        else:
            out[key] = tensor
    return out


def _pairs_to_halves(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    # Rows of each head in the order 0, 2, 4, ..., 1, 3, 5, ...
    return weight.unflatten(0, (-1, head_dim // 2, 2)).transpose(1, 2).flatten(0, 2)


def _halves_to_pairs(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    return weight.unflatten(0, (-1, 2, head_dim // 2)).transpose(1, 2).flatten(0, 2)


def to_hf(state: dict[str, torch.Tensor], args: ModelArgs | MoEArgs) -> dict[str, torch.Tensor]:
    """Our state dict -> LlamaForCausalLM's, or MixtralForCausalLM's (the output projection left
    out when tied). ValueError (one line) for a router bias that training moved."""
    out = {}
    for name, tensor in state.items():
        if args.tie_embeddings and name == "output.weight":
            continue
        if name.endswith(ROUTER_BIAS):
            if tensor.any():
                rate = args.bias_update_rate
                raise ValueError(
                    f"{name} is not zero (trained with model.bias_update_rate={rate}): "
                    "MixtralForCausalLM's router has no bias to hold it"
                )
            continue
        if name.endswith(("attention.wq.weight", "attention.wk.weight")):
            tensor = _pairs_to_halves(tensor, args.head_dim)
        names = expert_names(name, tensor.shape[0])
        pieces = zip(names, tensor, strict=True) if names else [(hf_name(name), tensor)]
        for hf, piece in pieces:  # a 3-D expert weight: one slice per expert
            out[hf] = piece.contiguous()
    return out


def from_hf(
    hf_state: dict[str, torch.Tensor], args: ModelArgs | MoEArgs
) -> dict[str, torch.Tensor]:
    """A Llama-family or Mixtral HF state dict -> ours, with exactly the names `args.build()`
    has; a Mixtral's experts stacked into our 3-D weights, its router bias zero.

    Raises ValueError naming a weight that is missing, left over, or of the wrong shape.
    """
    with torch.device("meta"):
        expected = args.build().state_dict()
    hf_state = _unfuse_experts(hf_state)
    out, used = {}, {"model.embed_tokens.weight"}
    for name, meta in expected.items():
        if name.endswith(ROUTER_BIAS):
            out[name] = torch.zeros(meta.shape, dtype=meta.dtype)
            continue
        experts = expert_names(name, meta.shape[0])
        sources = experts or [hf_name(name)]
        if name == "output.weight" and args.tie_embeddings and sources[0] not in hf_state:
            sources = ["model.embed_tokens.weight"]  # tied: saved once, as the embedding
        shape = tuple(meta.shape[1:] if experts else meta.shape)  # an expert's slice
        for source in sources:
            if source not in hf_state:
                raise ValueError(f"the Hugging Face weights have no {source} (for our {name})")
            if tuple(hf_state[source].shape) != shape:
                raise ValueError(
                    f"{source} has shape {tuple(hf_state[source].shape)}, expected {shape} "
                    f"for our {name}"
                )
        used.update(sources)
        parts = [hf_state[source] for source in sources]
        tensor = torch.stack(parts) if experts else parts[0]
        if name.endswith(("attention.wq.weight", "attention.wk.weight")):
            tensor = _halves_to_pairs(tensor, args.head_dim)
        out[name] = tensor.contiguous()
    extra = sorted(k for k in hf_state if k not in used and not k.endswith("rotary_emb.inv_freq"))
    if extra:
        raise ValueError(
            f"the Hugging Face weights have {len(extra)} tensor(s) our model lacks, e.g. "
            f"{extra[0]}; only {', '.join(SUPPORTED_MODEL_TYPES)} without biases are supported"
        )
    return out


def mixtral_problem(args: MoEArgs) -> str | None:
    """Why `MixtralForCausalLM` cannot compute our `MoETransformer(args)`, or None: Mixtral routes
    by a softmax over every expert, renormalised over the top k, to routed experts alone."""
    for name, mixtral in (
        ("n_shared_experts", 0),
        ("first_k_dense", 0),
        ("score_func", "softmax"),
        ("route_norm", True),
        ("route_scale", 1.0),
    ):
        if getattr(args, name) != mixtral:
            return f"model.{name}={getattr(args, name)!r}, and MixtralForCausalLM has {mixtral!r}"
    return None


def hf_config(args: ModelArgs | MoEArgs, dtype: torch.dtype, tokenizer=None) -> dict[str, Any]:
    """The config.json of the LlamaForCausalLM equal to our `Transformer(args)`, or of the
    MixtralForCausalLM equal to our `MoETransformer(args)` (see `mixtral_problem`), with the
    special token ids of the `tokenizer` it was trained with (`token_ids`)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.dim,
        "intermediate_size": args.hidden_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "vocab_size": args.vocab_size,
        "max_position_embeddings": args.max_seq_len,
        "rms_norm_eps": args.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": args.rope_theta},
        "rope_theta": args.rope_theta,  # read by transformers releases before v5
        "tie_word_embeddings": args.tie_embeddings,
        "initializer_range": args.init_std,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "dtype": str(dtype).removeprefix("torch."),
        **token_ids(tokenizer),
    }
    if not isinstance(args, MoEArgs):
        return config
    for key in ("attention_bias", "mlp_bias"):  # not MixtralConfig's
        del config[key]
    return {
        **config,
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "intermediate_size": args.expert_dim,  # each expert's width
        "num_local_experts": args.num_experts,
        "num_experts_per_tok": args.top_k,
        # The balancing weight it trained with; HF's statistic is batch-level (docs/MOE.md).
        "router_aux_loss_coef": args.aux_loss_coeff,
        "router_jitter_noise": 0.0,
        "output_router_logits": False,
        "sliding_window": None,
    }


# --- the tokenizer ---------------------------------------------------------------------------

BYTE_EOS_TOKEN = "<|endoftext|>"
"""The byte tokenizer's end-of-document id (256) as a Hugging Face token: the first of
`lm.tokenizer.EOS_CANDIDATES`, so the exported tokenizer.json read back as `data.tokenizer` has
the same end of document."""


def _byte_to_char() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, what the `ByteLevel` pre-tokenizer maps to."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    rest = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(rest)}}


def byte_tokenizer_json() -> str:
    """`lm.tokenizer.ByteTokenizer` as a `tokenizers` tokenizer.json: byte b is id b (a BPE over
    the 256 byte symbols with no merges), end of document is id 256."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in _byte_to_char().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(BYTE_EOS_TOKEN, special=True, normalized=False)])
    return tokenizer.to_str()


def hf_tokenizer_files(tokenizer, model_max_length: int) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json that
    `transformers.AutoTokenizer` loads as a tokenizer encoding text to the ids our `tokenizer`
    (`lm.tokenizer.ByteTokenizer` or `HFTokenizer`) gave the model in training. A tokenizer.json
    is copied without its post-processor: training added no special tokens (no BOS)."""
    from tokenizers import Tokenizer

    if getattr(tokenizer, "path", None) is None:
        text, eos = byte_tokenizer_json(), BYTE_EOS_TOKEN
    else:
        raw = json.loads(tokenizer.path.read_text(encoding="utf-8"))
        raw["post_processor"] = None
        text = json.dumps(raw, ensure_ascii=False)
        eos = (
            None
            if tokenizer.eos_id is None
            else Tokenizer.from_str(text).id_to_token(tokenizer.eos_id)
        )
    special = {"eos_token": eos} if eos is not None else {}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,  # decode returns the text as encoded
    }
    return {
        "tokenizer.json": text,
        "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
        "special_tokens_map.json": json.dumps(special, indent=2) + "\n",
    }


def token_ids(tokenizer) -> dict[str, int | None]:
    """config.json's and generation_config.json's special token ids: our tokenizer's end of
    document, and no BOS (training adds none). Unknown (no tokenizer): both None, not
    LlamaConfig's defaults of 1 and 2."""
    eos = None if tokenizer is None else tokenizer.eos_id
    return {"bos_token_id": None, "eos_token_id": eos}


def model_args_from_hf(hf_dir: Path) -> ModelArgs | MoEArgs:
    """Our `ModelArgs` (`MoEArgs` for Mixtral, `models.hf.moe_fields`) for the HF model in
    `hf_dir` (its config.json); ValueError (one line) when our model cannot represent it
    exactly."""

    raw = json.loads((hf_dir / "config.json").read_text())
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        hint = f" ({UNREPRESENTABLE[model_type]})" if model_type in UNREPRESENTABLE else ""
        raise ValueError(
            f"model_type={model_type!r}{hint} is not representable by our model; import "
            f"supports {', '.join(SUPPORTED_MODEL_TYPES)}. Train it as it is with "
            f"model=hf_llama model.pretrained_path={hf_dir} model.config=null"
        )
    spec = HFModelSpec(pretrained_path=str(hf_dir))
    cfg = spec.hf_config().to_dict()
    rope = cfg.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_type={rope['rope_type']!r} is not supported; only 'default' is")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(
            f"hidden_act={cfg['hidden_act']!r} is not supported; our MLPs are SwiGLU (silu)"
        )
    if cfg.get("router_jitter_noise"):
        raise ValueError(
            f"router_jitter_noise={cfg['router_jitter_noise']} is not supported (our router adds "
            "no noise in training); set it to 0.0 in config.json"
        )
    args = spec.to_model_args()
    window = cfg.get("sliding_window") if model_type in ("mistral", "mixtral") else None
    if window and window < args.max_seq_len:
        # Our attention sees the whole sequence; up to the window that is what Mistral and
        # Mixtral compute, and train.py refuses a data.seq_len above max_seq_len.
        args.max_seq_len = window
    return args
