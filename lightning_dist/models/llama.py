"""A Llama-style decoder as plain single-device PyTorch.

Parallelism is applied from outside (`lightning_dist.parallel`), so this file must stay free of
torch.distributed. Three conventions make that possible:

- Module names are fixed (`tok_embeddings`, `layers.<i>.attention.wq`, ..., `norm`, `output`):
  tensor-parallel plans address modules by these names.
- `layers` is an `nn.ModuleDict` keyed "0".."n-1", and `tok_embeddings`, `norm` and `output` may
  be set to None: a pipeline stage deletes what it does not own and keeps the remaining names.
- Attention infers the number of heads from the projected tensors, never from the args, so a
  tensor-parallel shard that holds a slice of the heads runs the same code.

The model is meant to be built on the meta device and materialised with
`model.to_empty(device=...)` followed by `model.init_weights()`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# The shape, not `ModelArgs` (args.py), which builds this module's Transformer: no import circle.
from lightning_dist.models.documents import document_causal_mask
from lightning_dist.models.shape import LlamaShape


def precompute_rope(
    head_dim: int, max_seq_len: int, theta: float, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine tables of the rotary embedding, each of shape [max_seq_len, head_dim // 2].

    Always float32: positions near 128k lose their phase in bfloat16.
    """
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    )
    positions = torch.arange(max_seq_len, device=device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs (x[2i], x[2i+1]) of x [b, s, heads, head_dim] by position.

    This is the interleaved-pair convention of Meta's Llama reference code; `cos`/`sin` are
    [s, head_dim // 2], or [b, s, head_dim // 2] when each sequence has its own positions
    (packed documents). The rotation runs in float32 and the result is cast back to x's dtype.
    """
    pairs = x.float().unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    cos, sin = (t.unsqueeze(-2) if t.dim() == 3 else t[None, :, None, :] for t in (cos, sin))
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class _RMSNormFunction(torch.autograd.Function):
    """y = x / rms(x) * weight in float32, saving x and 1 / rms(x) for backward; y has the
    dtype `out_dtype`.

    Autograd would also keep the float32 normalised x (and in bf16 a float32 copy of x), d
    floats per token that backward can recompute from x for the cost of one multiply.
    """

    @staticmethod
    def forward(
        ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype
    ) -> torch.Tensor:
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd * weight.float()).to(out_dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        normed = x.float() * rstd
        g = grad.float()
        gw = g * weight.float()
        grad_x = rstd * (gw - normed * (gw * normed).mean(-1, keepdim=True))
        grad_weight = (g * normed).sum(dim=tuple(range(g.dim() - 1)))
        return grad_x.type_as(x), grad_weight.type_as(weight), None, None


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale, computed in float32.

    The output has the input's dtype whatever the weight's, so a float32 weight does not
    silently promote bfloat16 activations; under autocast it has the autocast dtype, so the
    projections that read it share one low-precision copy instead of casting one each (the
    values are the same: each would round the same float32 numbers). Only the input (and one
    float per token) is kept for backward.
    """

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        autocast = torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)
        dtype = torch.get_autocast_dtype(device) if autocast else x.dtype
        return _RMSNormFunction.apply(x, self.weight, self.eps, dtype)

    def reset_parameters(self) -> None:
        """Set the scale to one."""
        nn.init.ones_(self.weight)


def _kernel_groups_heads(q: torch.Tensor) -> bool:
    """Can SDPA group the query heads itself (`enable_gqa`) without leaving its fast kernel?
    On CPUs its flash kernel does, keeping k and v unrepeated for backward. On CUDA only the
    flash kernel takes `enable_gqa` (fp16/bf16, head_dim up to 256); elsewhere SDPA would fall
    back to the math path and its s x s scores, so k and v are repeated instead. (The CUDA
    branch has never run on a GPU.)"""
    if q.device.type == "cpu":
        return True
    return q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256


class Attention(nn.Module):
    """Causal grouped-query self-attention with rotary positions; given `documents` (the
    document id of each token, [b, s]: packed documents), a token attends only to its own
    document (`models/documents.py`).

    `attend`, None here, is where a parallel wrapper puts its own attention step (context
    parallelism, `parallel/context_parallel.py`): called as `attend(q, k, v)` on
    [b, heads, s, head_dim] tensors after the rotary step (with `documents=` when given), it
    returns the attention output."""

    attend = None

    def __init__(self, args: LlamaShape):
        super().__init__()
        self.head_dim = args.head_dim
        kv_dim = args.kv_heads * args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, kv_dim, bias=False)
        self.wv = nn.Linear(args.dim, kv_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        rope_cos: torch.Tensor,
        rope_sin: torch.Tensor,
        documents: torch.Tensor | None = None,
    ):
        bsz, seqlen, _ = x.shape
        # -1 heads: under tensor parallelism wq/wk/wv hold only this rank's heads.
        q = self.wq(x).view(bsz, seqlen, -1, self.head_dim)
        k = self.wk(x).view(bsz, seqlen, -1, self.head_dim)
        v = self.wv(x).view(bsz, seqlen, -1, self.head_dim)
        cos, sin = rope_cos[..., :seqlen, :], rope_sin[..., :seqlen, :]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [b, heads, s, head_dim]
        if self.attend is not None:
            by_document = {} if documents is None else {"documents": documents}
            out = self.attend(q, k, v, **by_document)
            return self.wo(out.transpose(1, 2).reshape(bsz, seqlen, -1))
        # Query head i reads kv head i // repeats: the grouping of the Llama reference and
        # Hugging Face, which also holds per tensor-parallel shard of contiguous heads.
        grouped = q.shape[1] != k.shape[1]
        if grouped and not _kernel_groups_heads(q):
            repeats = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(repeats, dim=1)
            v = v.repeat_interleave(repeats, dim=1)
            grouped = False
        mask = None
        if documents is not None:
            causal = torch.ones(seqlen, seqlen, dtype=torch.bool, device=q.device).tril()
            mask = document_causal_mask(documents, documents, causal)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=grouped
        )
        return self.wo(out.transpose(1, 2).reshape(bsz, seqlen, -1))


class _SwiGLUFunction(torch.autograd.Function):
    """silu(gate) * up, saving only `gate` and `up` for backward.

    Autograd would also keep silu(gate), one more hidden-size tensor per token; backward
    recomputes it (one pointwise op). The gradients are autograd's, op for op.
    """

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        return grad_gate, grad * F.silu(gate)


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x); the product keeps only w1 x and w3 x for backward."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)  # gate
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)  # up
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(_SwiGLUFunction.apply(self.w1(x), self.w3(x)))

    def init_weights(self, std: float, out_std: float) -> None:
        """Normal init; `w2`, which writes into the residual, uses `out_std`."""
        nn.init.normal_(self.w1.weight, mean=0.0, std=std)
        nn.init.normal_(self.w3.weight, mean=0.0, std=std)
        nn.init.normal_(self.w2.weight, mean=0.0, std=out_std)


class TransformerBlock(nn.Module):
    """Pre-norm residual block: attention then a SwiGLU MLP, or the `feed_forward` module given
    (a mixture of experts, `models/moe.py`: any module with `init_weights(std, out_std)`)."""

    def __init__(self, args: LlamaShape, feed_forward: nn.Module | None = None):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = feed_forward or FeedForward(args.dim, args.hidden_dim)

    def forward(
        self,
        h: torch.Tensor,
        rope_cos: torch.Tensor,
        rope_sin: torch.Tensor,
        documents: torch.Tensor | None = None,
    ):
        h = h + self.attention(self.attention_norm(h), rope_cos, rope_sin, documents)
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self, std: float, out_std: float) -> None:
        """Normal init of the projections; the two that write into the residual use `out_std`."""
        for linear in (self.attention.wq, self.attention.wk, self.attention.wv):
            nn.init.normal_(linear.weight, mean=0.0, std=std)
        nn.init.normal_(self.attention.wo.weight, mean=0.0, std=out_std)
        self.feed_forward.init_weights(std, out_std)
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()


# Megatron-style tensor-parallel plan (see lightning_dist.models.protocol for the style names).
TP_PLAN: dict[str, str] = {
    "tok_embeddings": "embedding",
    "layers.*.attention_norm": "norm",
    "layers.*.attention": "sp_input",
    "layers.*.attention.wq": "colwise",
    "layers.*.attention.wk": "colwise",
    "layers.*.attention.wv": "colwise",
    "layers.*.attention.wo": "rowwise",
    "layers.*.ffn_norm": "norm",
    "layers.*.feed_forward": "sp_input",
    "layers.*.feed_forward.w1": "colwise",
    "layers.*.feed_forward.w3": "colwise",
    "layers.*.feed_forward.w2": "rowwise",
    "norm": "norm",
    "output": "output",
}


class Transformer(nn.Module):
    """Llama-style decoder: embeddings, `n_layers` blocks, final norm, output projection.

    Built under `torch.device("meta")` it allocates nothing. Built on a real device it is
    initialised right away, and for the same RNG state its weights equal those of the meta route
    (`to_empty` + `init_weights`), so either route gives the same model for the same seed.
    It implements both contracts of `lightning_dist.models.protocol` (TP plan, pipeline layers).
    """

    tp_plan = TP_PLAN
    pipeline_blocks = "layers"
    pipeline_first = ("tok_embeddings",)
    pipeline_last = ("norm", "output")
    output_head = "output"
    """The output projection, which a chunked loss may apply itself (`lm.chunked_loss`)."""
    takes_documents = True
    """`forward` takes `documents` and keeps attention inside each (`data.pack_documents`)."""

    def __init__(self, args: LlamaShape):
        super().__init__()
        self.args = args
        device = torch.empty(0).device  # honours `with torch.device(...)` and the default device
        # Build on meta first so construction consumes no RNG and allocates nothing; the real
        # weights come from init_weights alone, whichever route built the model.
        with torch.device("meta"):
            self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
            self.layers = nn.ModuleDict({str(i): self.block(args, i) for i in range(args.n_layers)})
            self.norm = RMSNorm(args.dim, eps=args.norm_eps)
            self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
            cos, sin = precompute_rope(args.head_dim, args.max_seq_len, args.rope_theta)
        # Not persistent: derived from args, so checkpoints neither store nor expect them.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        if device.type != "meta":
            self.to_empty(device=device)
            self.init_weights()

    def block(self, args: LlamaShape, layer: int) -> TransformerBlock:
        """Block `layer` (built on the meta device); a model with other blocks overrides it."""
        return TransformerBlock(args)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token ids [b, s] to logits [b, s, vocab].

        On a pipeline stage without `tok_embeddings` the input is hidden states [b, s, dim];
        on one without `norm`/`output` the hidden states are returned as they are. `positions`
        ([s], or [b, s] per sequence) are the tokens' rotary positions when they are not
        0 .. s-1 (a context-parallel rank's chunks, places in packed documents). `documents`
        [b, s], each token's document id, keeps attention inside each document.
        """
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        cos, sin = self.rope_cos, self.rope_sin
        if positions is not None:
            cos, sin = cos[positions], sin[positions]
        for layer in self.layers.values():
            h = layer(h, cos, sin, documents)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device | str | None = None) -> None:
        """(Re)initialise every parameter and buffer from the current torch RNG.

        Linear and embedding weights are normal(0, init_std); `wo` and `w2`, which write into
        the residual stream, use init_std / sqrt(2 * n_layers) so its variance does not grow
        with depth (GPT-2). Norm scales are one. The rotary tables are recomputed on
        `buffer_device`, by default where they already live. Modules a pipeline stage removed
        (None, or missing layers) are skipped; the RNG is drawn in module order.
        """
        args = self.args
        std = args.init_std
        out_std = std / math.sqrt(2 * args.n_layers)
        if buffer_device is None:
            buffer_device = self.rope_cos.device
        self.rope_cos, self.rope_sin = precompute_rope(
            args.head_dim, args.max_seq_len, args.rope_theta, device=buffer_device
        )
        self._retie()
        if self.tok_embeddings is not None:
            nn.init.normal_(self.tok_embeddings.weight, mean=0.0, std=std)
        for layer in self.layers.values():
            layer.init_weights(std, out_std)
        if self.norm is not None:
            self.norm.reset_parameters()
        if self.output is not None and not self._is_tied():
            nn.init.normal_(self.output.weight, mean=0.0, std=std)

    def _is_tied(self) -> bool:
        return (
            self.tok_embeddings is not None
            and self.output is not None
            and self.output.weight is self.tok_embeddings.weight
        )

    def _retie(self) -> None:
        # `to_empty` from meta gives each module its own new Parameter, which silently unties
        # the output projection from the embedding; tie them again before drawing weights.
        if self.args.tie_embeddings and self.tok_embeddings is not None and self.output is not None:
            if self.output.weight is not self.tok_embeddings.weight:
                self.output.weight = self.tok_embeddings.weight
