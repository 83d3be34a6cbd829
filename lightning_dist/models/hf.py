"""Hugging Face causal language models behind the same small interface as `ModelArgs`.

`HFModelSpec` describes the model (a config dict for random init, or a local pretrained
directory) and answers the planner's questions (parameter count, training FLOPs) by mapping a
Llama-family config onto `ModelArgs`, and a mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE)
onto `MoEArgs` (`moe_fields`), whose FLOPs are those of the active experts. `HFCausalLM` is the
`nn.Module` that wraps the HF model so that the rest of the package sees `forward(tokens) ->
logits` and `init_weights()`.

transformers is an optional dependency and is imported only when it is needed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightning_dist._compat import HF_INITIALIZED_FLAG
from lightning_dist.models.args import HFModelSettings, ModelArgs, MoEArgs

# LlamaConfig's defaults, used to read a config dict when transformers is not installed (the
# planner must run on a laptop without the `hf` extra).
_LLAMA_DEFAULTS: dict[str, Any] = {
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
}

IMPORTABLE_MODEL_TYPES = ("llama", "mistral", "mixtral")
"""The Hugging Face architectures `python -m lightning_dist.checkpoint import` converts into our
model exactly (checkpoint/hf.py)."""
NOT_IMPORTABLE = {
    "qwen2": "q/k/v biases",
    "qwen2_moe": "q/k/v biases, and a shared expert scaled by sigmoid(shared_expert_gate(x))",
    "qwen3_moe": "q_norm and k_norm: an RMSNorm on each head's queries and keys",
}
"""What our model lacks of the Hugging Face architectures that are closest to it."""

HF_MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")
"""Hugging Face mixtures of experts that `to_model_args` describes as `MoEArgs`."""


def moe_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The `MoEShape` fields of a Mixtral, Qwen2-MoE or Qwen3-MoE config (a `to_dict()`).

    Routing is softmax over every expert, then the top `num_experts_per_tok`, renormalised to
    sum to 1 for Mixtral, and for Qwen where `norm_topk_prob` (`MoEShape.route_norm`). Mixtral's
    experts are `intermediate_size` wide; Qwen's `moe_intermediate_size`, its dense layers (the
    first `first_k_dense`, `mlp_only_layers`) `intermediate_size`, and Qwen2's shared expert
    `shared_expert_intermediate_size`. Neither balancing method is carried over: HF's load
    balancing loss (`router_aux_loss_coef`) is a batch-level statistic, ours per sequence, so
    set `model.aux_loss_coeff` to train with ours. ValueError for a pattern of MoE layers or a
    shared expert width `MoEShape` cannot describe."""
    model_type = cfg.get("model_type")
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or 8
    fields = dict(
        num_experts=experts,
        top_k=cfg.get("num_experts_per_tok", 2),
        aux_loss_coeff=0.0,
        bias_update_rate=0.0,
        score_func="softmax",
    )
    if model_type == "mixtral":
        return {**fields, "expert_hidden_size": cfg["intermediate_size"], "route_norm": True}
    expert = cfg["moe_intermediate_size"]
    n_layers, step = cfg["num_hidden_layers"], cfg.get("decoder_sparse_step", 1)
    dense = [i for i in range(n_layers) if i in cfg.get("mlp_only_layers", []) or (i + 1) % step]
    if dense != list(range(len(dense))):
        raise ValueError(
            f"{model_type} has dense MLPs in layers {dense} (mlp_only_layers, decoder_sparse_step="
            f"{step}); MoEArgs describes only the first k layers dense (first_k_dense)"
        )
    shared = cfg.get("shared_expert_intermediate_size", 0) if model_type == "qwen2_moe" else 0
    if shared % expert:
        raise ValueError(
            f"shared_expert_intermediate_size={shared} is not a multiple of moe_intermediate_size="
            f"{expert}; MoEArgs' shared experts are n_shared_experts x the expert width"
        )
    return {
        **fields,
        "expert_hidden_size": expert,
        "n_shared_experts": shared // expert,
        "first_k_dense": len(dense),
        "route_norm": bool(cfg.get("norm_topk_prob", False)),
    }


def _import_transformers():
    try:
        import transformers
    except ImportError as err:
        raise ImportError(
            "Hugging Face models need the `transformers` package: "
            'run `pip install -e ".[hf]"` in the lightning_dist checkout.'
        ) from err
    return transformers


@dataclass(kw_only=True)
class HFModelSpec(HFModelSettings):
    """A Hugging Face causal LM: either a random-init `config` or a local `pretrained_path`
    (the settings are `HFModelSettings`'s, declared there without torch)."""

    def __post_init__(self) -> None:
        if (self.config is None) == (self.pretrained_path is None):
            raise ValueError(
                "HFModelSpec needs exactly one of `config` (random init) and `pretrained_path` "
                f"(load weights); got config={'set' if self.config is not None else None} and "
                f"pretrained_path={self.pretrained_path!r}"
            )
        if self.config is not None and not isinstance(self.config, dict):
            # Hydra passes nested mappings as DictConfig; transformers wants plain values.
            from omegaconf import OmegaConf

            self.config = OmegaConf.to_container(self.config, resolve=True)
        if self.pretrained_path is not None:
            path = Path(self.pretrained_path).expanduser()
            if not (path / "config.json").is_file():
                raise FileNotFoundError(
                    f"pretrained_path={self.pretrained_path!r} is not a local directory with a "
                    "config.json (write one with `model.save_pretrained(path)`)"
                )
            self.pretrained_path = str(path)

    # --- the model description --------------------------------------------------------------

    def raw_config(self) -> dict[str, Any]:
        """The config as given: the `config` dict, or the pretrained directory's config.json."""
        if self.config is not None:
            return dict(self.config)
        return json.loads((Path(self.pretrained_path) / "config.json").read_text())

    def hf_config(self):
        """The transformers `PretrainedConfig` object for this model."""
        transformers = _import_transformers()
        if self.pretrained_path is not None:
            return transformers.AutoConfig.from_pretrained(self.pretrained_path)
        kwargs = dict(self.config)
        model_type = kwargs.pop("model_type", "llama")
        return transformers.AutoConfig.for_model(model_type, **kwargs)

    def _resolved_config(self) -> dict[str, Any]:
        try:
            return self.hf_config().to_dict()
        except ImportError:
            return {**_LLAMA_DEFAULTS, **self.raw_config()}

    def to_model_args(self) -> ModelArgs | MoEArgs:
        """The equivalent `ModelArgs` of a Llama-family config, for parameter and FLOP counts;
        `MoEArgs` for a mixture of experts (`HF_MOE_TYPES`, `moe_fields`: exact for Mixtral;
        Qwen's q/k/v biases, q/k norms and shared-expert gate are not counted).

        Raises ValueError for configs whose weights `ModelArgs` cannot count (biases, or a
        head_dim other than hidden_size / num_attention_heads).
        """
        cfg = self._resolved_config()
        for flag in ("attention_bias", "mlp_bias"):
            if cfg.get(flag):
                raise ValueError(f"{flag}=True is not representable by ModelArgs")
        dim, n_heads = cfg["hidden_size"], cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or dim // n_heads
        if head_dim * n_heads != dim:
            raise ValueError(
                f"head_dim={head_dim} * num_attention_heads={n_heads} != hidden_size={dim}; "
                "ModelArgs cannot describe this model"
            )
        rope = cfg.get("rope_parameters") or {}
        moe = cfg.get("model_type") in HF_MOE_TYPES
        return (MoEArgs if moe else ModelArgs)(
            **(moe_fields(cfg) if moe else {}),
            dim=dim,
            n_layers=cfg["num_hidden_layers"],
            n_heads=n_heads,
            n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
            vocab_size=cfg["vocab_size"],
            ffn_hidden_size=cfg["intermediate_size"],
            norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 10000.0)),
            max_seq_len=cfg["max_position_embeddings"],
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            init_std=cfg.get("initializer_range", 0.02),
        )

    @property
    def vocab_size(self) -> int:
        """Rows of the embedding and of the output projection."""
        return self.to_model_args().vocab_size

    @property
    def max_seq_len(self) -> int:
        """Longest sequence the model is configured for (max_position_embeddings)."""
        return self.to_model_args().max_seq_len

    def num_params(self) -> int:
        """Total trainable parameters, as the built HF model reports them.

        Counted on a meta-device build when transformers is installed, so architectures with
        weights `ModelArgs` does not describe (Qwen2's q/k/v biases) count exactly; else from
        `to_model_args()`.
        """
        try:
            with torch.device("meta"):
                model = self.build().hf_model
        except ImportError:
            return self.to_model_args().num_params()
        return sum(p.numel() for p in model.parameters())

    def train_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, counted as `ModelArgs.train_flops_per_token` does."""
        return self.to_model_args().train_flops_per_token(seq_len)

    def build(self) -> HFCausalLM:
        """Build the `HFCausalLM` on the current default device (use meta for large models)."""
        return HFCausalLM(self)


# Tensor-parallel plan of LlamaForCausalLM and the architectures with its module names (Mistral,
# Qwen2, whose q/k/v biases are split with their weights, ...). No sequence parallelism: HF
# computes rotary positions from the length of the hidden states, which would be the local
# sequence shard.
HF_LLAMA_TP_PLAN: dict[str, str] = {
    "hf_model.model.embed_tokens": "embedding",
    "hf_model.model.layers.*.self_attn.q_proj": "colwise",
    "hf_model.model.layers.*.self_attn.k_proj": "colwise",
    "hf_model.model.layers.*.self_attn.v_proj": "colwise",
    "hf_model.model.layers.*.self_attn.o_proj": "rowwise",
    "hf_model.model.layers.*.mlp.gate_proj": "colwise",
    "hf_model.model.layers.*.mlp.up_proj": "colwise",
    "hf_model.model.layers.*.mlp.down_proj": "rowwise",
    "hf_model.lm_head": "output",
}


class HFCausalLM(nn.Module):
    """An HF causal LM with the package's model interface: `forward(tokens) -> logits`.

    The architecture is always created on the meta device and its weights come only from
    `init_weights()`: random HF init from the current torch RNG, or the checkpoint of
    `spec.pretrained_path`. Built on a real device it initialises itself right away, so the
    direct route and the meta route (`to_empty` + `init_weights`) give the same weights.

    It implements both contracts of `lightning_dist.models.protocol`: the Llama-family TP plan,
    and the pipeline layers, for which a stage runs the decoder layers itself (`_stage_forward`).
    """

    tp_plan = HF_LLAMA_TP_PLAN
    pipeline_blocks = "hf_model.model.layers"
    pipeline_first = ("hf_model.model.embed_tokens",)
    pipeline_last = ("hf_model.model.norm", "hf_model.lm_head")

    @property
    def model_type(self) -> str:
        """The Hugging Face architecture (`config.model_type`: llama, mixtral, qwen2_moe, ...)."""
        return str(self.hf_model.config.model_type)

    def __init__(self, spec: HFModelSpec):
        super().__init__()
        transformers = _import_transformers()
        self.spec = spec
        device = torch.empty(0).device  # honours `with torch.device(...)` and the default device
        with torch.device("meta"):
            # from_pretrained refuses a meta context, so the pretrained route also starts from
            # the config; the checkpoint is read in init_weights.
            self.hf_model = transformers.AutoModelForCausalLM.from_config(
                spec.hf_config(),
                attn_implementation=spec.attn_implementation,
                dtype=torch.get_default_dtype(),
            )
        if device.type != "meta":
            self.to_empty(device=device)
            self.init_weights()

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids [b, s] to logits [b, s, vocab] (a pipeline stage: see `_stage_forward`).
        `positions` ([s] or [b, s]) are the tokens' rotary positions when they are not
        0 .. s-1: a context-parallel rank's chunks (`parallel/hf_context_parallel.py`)."""
        position_ids = None if positions is None else _position_ids(positions)
        if self._is_stage():
            return self._stage_forward(tokens, position_ids)
        return self.hf_model(input_ids=tokens, position_ids=position_ids, use_cache=False).logits

    def _is_stage(self) -> bool:
        # Pipeline splitting replaces the ModuleList of layers by a ModuleDict of the kept ones.
        return not isinstance(self.hf_model.model.layers, nn.ModuleList)

    def _stage_forward(self, x: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        """What a pipeline stage keeps of the Llama forward: token ids or hidden states in,
        hidden states or logits out. Causal attention without padding, as in training."""
        core = self.hf_model.model
        h = core.embed_tokens(x) if core.embed_tokens is not None else x
        if positions is None:
            positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        rope = core.rotary_emb(h, position_ids=positions)
        for layer in core.layers.values():
            h = layer(h, attention_mask=None, position_ids=positions, position_embeddings=rope)
        if core.norm is not None:
            h = core.norm(h)
        if self.hf_model.lm_head is not None:
            h = self.hf_model.lm_head(h)
        return h

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device | str | None = None) -> None:
        """(Re)initialise every parameter and buffer in place, after `to_empty` or at any time.

        Runs the model's own HF init from the current torch RNG (buffers such as the rotary
        frequencies included), then loads the checkpoint when the spec has a pretrained path.
        `buffer_device` is accepted for interface parity; buffers stay where they are.
        """
        del buffer_device
        model = self.hf_model
        # HF marks modules and tensors as initialised and skips them afterwards; clear the marks
        # so a second call (or one after to_empty) really re-draws everything.
        for module in model.modules():
            module.__dict__.pop(HF_INITIALIZED_FLAG, None)
        for tensor in [*model.parameters(), *model.buffers()]:
            if hasattr(tensor, HF_INITIALIZED_FLAG):
                delattr(tensor, HF_INITIALIZED_FLAG)
        # to_empty from meta unties lm_head from the embedding; tie before drawing so the RNG
        # is consumed the same way whichever route built the model. A pipeline stage holds at
        # most one of the two, so there is nothing to tie.
        whole = not self._is_stage()
        if whole:
            model.tie_weights()
        model.initialize_weights()
        if whole:
            model.tie_weights()
        if self.spec.pretrained_path is not None:
            self._load_pretrained()

    def _load_pretrained(self) -> None:
        transformers = _import_transformers()
        source = transformers.AutoModelForCausalLM.from_pretrained(
            self.spec.pretrained_path,
            attn_implementation=self.spec.attn_implementation,
            dtype=next(self.hf_model.parameters()).dtype,
        )
        self.hf_model.load_state_dict(source.state_dict())


def _position_ids(positions: torch.Tensor) -> torch.Tensor:
    """transformers' `position_ids` ([b, s] or [1, s]) from positions [s] or [b, s]."""
    return positions.unsqueeze(0) if positions.dim() == 1 else positions
