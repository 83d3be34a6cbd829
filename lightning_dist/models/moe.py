"""A mixture-of-experts decoder as plain single-device PyTorch (docs/MOE.md).

`MoETransformer` is our `Transformer` whose feed-forward networks, after the first
`first_k_dense` layers, are `MoE` layers: a `Router` picks each token's `top_k` experts, every
token reaches them (dropless: no capacity, nothing dropped), the `GroupedExperts` run as grouped
matmuls over the tokens sorted by expert, and an optional shared expert sees every token.

Like `Attention.attend`, two seams are None on one device, and a parallel wrapper sets them on
each `MoE` module from outside (this file imports no torch.distributed):

- `run_experts(experts, x, counts) -> y`: `x` [N, dim] holds this rank's routed token copies
  sorted by expert (the copies of one expert in token order), `counts` [num_experts] (int64,
  summing to N) how many rows each expert has; `y` [N, dim] holds each row's expert output, in
  the same order. None runs `experts(x, counts)`. Expert parallelism replaces it with the
  dispatch (all-to-all of counts, then of rows), the local grouped matmul on its shard of the
  experts, and the combine (all-to-all back).
- `sequence_sum(stats) -> stats`: `stats` [b, 2 x num_experts + 1] (float32) holds, per
  sequence of this rank, the tokens routed to each expert, the sum of each expert's normalised
  score (with autograd) and the token count; it returns their sums over the ranks that hold the
  rest of the same sequences. None is the identity: on one device, and under data or pipeline
  parallelism, each rank holds whole sequences. Context parallelism sets a differentiable
  all-reduce (sum) over its group.

Routing is deterministic: the router's logits, scores and top-k run in float32 whatever the
autocast, and ties are broken by a stable sort, the lower expert index first, so that a layout
that computes the same logits routes every token the same way.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from lightning_dist._compat import grouped_mm, in_backward
from lightning_dist.models.llama import (
    TP_PLAN,
    FeedForward,
    Transformer,
    TransformerBlock,
    _SwiGLUFunction,
)
from lightning_dist.models.shape import MoEShape

_GROUPED_MM = grouped_mm()
_GROUPED_MM_DTYPES = {
    "cpu": (torch.float32, torch.bfloat16, torch.float16),
    "cuda": (torch.bfloat16,),
}
"""Where `torch._grouped_mm` runs (measured on CPU with torch 2.13: not float64; CUDA from its
documentation: bfloat16 on compute capability 8.0 or newer)."""


def _autocast_dtype(device: str) -> torch.dtype | None:
    """The autocast dtype on `device` when autocast is on there, else None."""
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return None


def grouped_mm_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Can `torch._grouped_mm` run `x` [N, in] against `weight` [E, out, in] here? Its kernels
    take the dtypes of `_GROUPED_MM_DTYPES` and rows whose widths are multiples of 16 bytes."""
    if _GROUPED_MM is None or x.dtype != weight.dtype:
        return False
    if x.dtype not in _GROUPED_MM_DTYPES.get(x.device.type, ()):
        return False
    if x.device.type == "cuda" and torch.cuda.get_device_capability(x.device) < (8, 0):
        return False
    return all(n * x.element_size() % 16 == 0 for n in (weight.shape[1], weight.shape[2]))


class _ContiguousGrad(torch.autograd.Function):
    """The identity, whose backward makes the incoming gradient contiguous: the grouped matmul's
    backward refuses a gradient of strides [0, 0] (that of `out.sum()`, measured on CPU)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def _grouped_linear(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor):
    """Rows of `x` [N, in] times their expert's `weight[e]`.T ([E, out, in], nn.Linear's layout)."""
    return _ContiguousGrad.apply(_GROUPED_MM(x, weight.transpose(-2, -1), offs=offsets))


def expert_mlp(
    x: torch.Tensor,
    counts: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    *,
    grouped: bool,
) -> torch.Tensor:
    """SwiGLU experts over rows sorted by expert: rows `counts[e]` of `x` [N, dim] go through
    expert e, w2[e](silu(w1[e] x) * w3[e] x). `grouped` runs the three grouped matmuls; else a
    loop over the experts, which gives the same numbers (tests/unit/test_moe.py) wherever
    `grouped_mm_supported` is False, e.g. float64, and copies `counts` to the host."""
    if grouped:
        offsets = counts.cumsum(0).to(torch.int32)
        gate, up = _grouped_linear(x, w1, offsets), _grouped_linear(x, w3, offsets)
        return _grouped_linear(_SwiGLUFunction.apply(gate, up), w2, offsets)
    outputs = []
    for e, rows in enumerate(x.split(counts.tolist())):
        hidden = _SwiGLUFunction.apply(F.linear(rows, w1[e]), F.linear(rows, w3[e]))
        outputs.append(F.linear(hidden, w2[e]))
    return torch.cat(outputs)


def run_grouped_experts(
    x: torch.Tensor, counts: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor
) -> torch.Tensor:
    """`expert_mlp` of `GroupedExperts`' weights (or an expert-parallel rank's slice of them,
    `counts` then one per expert of the slice): under autocast the operands are cast to its
    dtype first, as autocast casts a matmul's (it has no rule for the grouped matmul)."""
    weights = (w1, w2, w3)
    dtype = _autocast_dtype(x.device.type)
    if dtype is not None:
        x, weights = x.to(dtype), tuple(w.to(dtype) for w in weights)
    # The grouped matmul's backward refuses zero rows (torch 2.13, CPU: "Invalid
    # strides/sizes"), which an expert-parallel rank may receive; the loop takes them.
    grouped = x.shape[0] > 0 and all(grouped_mm_supported(x, w) for w in weights)
    return expert_mlp(x, counts, *weights, grouped=grouped)


class GroupedExperts(nn.Module):
    """`num_experts` SwiGLU MLPs held as 3-D weights [num_experts, out, in] (expert e's slice is
    an nn.Linear weight): expert parallelism shards dim 0, and checkpoints keep these names."""

    def __init__(self, dim: int, hidden_dim: int, num_experts: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))  # gate
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))  # up
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))  # down

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows of `x` [N, dim] sorted by expert, `counts` [num_experts] rows each."""
        return run_grouped_experts(x, counts, self.w1, self.w2, self.w3)

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.w1, mean=0.0, std=std)
        nn.init.normal_(self.w3, mean=0.0, std=std)
        nn.init.normal_(self.w2, mean=0.0, std=out_std)


class Router(nn.Module):
    """Scores the experts for each token and picks its `top_k` (see the module docs).

    `expert_bias` (float32 buffer, saved in checkpoints) is added to the scores only to choose
    the experts (DeepSeek-V3's auxiliary-loss-free balancing, `MoEShape.bias_update_rate`);
    the weights of the chosen experts are the scores themselves."""

    def __init__(self, args: MoEShape):
        super().__init__()
        self.top_k, self.score_func = args.top_k, args.score_func
        self.route_norm, self.route_scale = args.route_norm, args.route_scale
        self.gate = nn.Linear(args.dim, args.num_experts, bias=False)
        self.register_buffer("expert_bias", torch.zeros(args.num_experts, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Tokens `x` [T, dim] to (scores [T, E], chosen experts [T, k], their weights [T, k]),
        the scores and weights in float32."""
        device = x.device.type
        autocast = _autocast_dtype(device) is not None
        with torch.autocast(device, enabled=False) if autocast else contextlib.nullcontext():
            logits = F.linear(x.float(), self.gate.weight.float())
        scores = logits.softmax(-1) if self.score_func == "softmax" else logits.sigmoid()
        choice = scores.detach() + self.expert_bias.float()
        # A stable sort keeps tied experts in index order: the lower index wins the tie.
        # A copy of the first k columns: gather saves its index for backward, and a view would
        # keep the whole [T, E] sort alive (8 E bytes a token instead of 8 k).
        order = choice.sort(dim=-1, descending=True, stable=True).indices
        chosen = order[:, : self.top_k].clone()
        weights = scores.gather(-1, chosen)
        if self.route_norm:
            weights = weights / weights.sum(-1, keepdim=True)
        return scores, chosen, weights * self.route_scale

    @torch.no_grad()
    def update_bias(self, load: torch.Tensor, rate: float) -> None:
        """Move `expert_bias` by `rate` towards balance: + for each expert whose `load` (tokens
        over a whole step, or any positive multiple of them) is below the mean, - above it."""
        load = load.to(self.expert_bias.device, torch.float64)
        self.expert_bias += rate * torch.sign(load.mean() - load).to(self.expert_bias.dtype)

    def init_weights(self, std: float) -> None:
        nn.init.normal_(self.gate.weight, mean=0.0, std=std)
        self.expert_bias.zero_()


class MoE(nn.Module):
    """Routed experts plus optional shared experts in place of a block's MLP (module docs).

    In training it keeps, for the caller: `aux_loss`, this forward's load-balancing loss
    (`MoEShape.aux_loss_coeff`; None when off), and the tokens routed to each expert since
    the last `take_step_load()` (every micro-batch of an optimizer step). A forward that
    activation checkpointing reruns in backward adds to neither."""

    run_experts = None
    """Seam: `run_experts(experts, x, counts)` (module docs); None: `experts(x, counts)`."""
    sequence_sum = None
    """Seam: `sequence_sum(stats)` over the ranks of a split sequence (module docs)."""
    aux_grad_scale: float | None = None
    """None: the caller adds `aux_loss` to the loss it differentiates (one device, data, expert
    and tensor parallelism). A number s: the layer itself adds s x d(aux)/d(its inputs and
    weights) to the backward that reaches its output, and `aux_loss` is the detached sum over
    forwards, for the record only: under pipeline parallelism only the last stage computes the
    loss, so the pipeline sets s to the weight of one microbatch's loss (`_AuxLossGradient`)."""
    recording = True
    """Whether a training forward adds to `aux_loss` and the step's loads. A pipeline turns it
    off outside its microbatches' forwards: torch runs each stage once more on empty tensors to
    learn the shapes it sends (parallel/pipeline.py)."""

    def __init__(self, args: MoEShape, layer: int):
        super().__init__()
        self.layer = layer
        """The block index: this layer's row in `take_step_loads`' table."""
        self.num_experts, self.top_k = args.num_experts, args.top_k
        self.aux_loss_coeff, self.bias_update_rate = args.aux_loss_coeff, args.bias_update_rate
        self.normalise_scores = args.score_func == "sigmoid"
        self.router = Router(args)
        self.experts = GroupedExperts(args.dim, args.expert_dim, args.num_experts)
        shared = args.n_shared_experts * args.expert_dim
        self.shared_expert = FeedForward(args.dim, shared) if shared else None
        self.aux_loss: torch.Tensor | None = None
        self._step_load: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seqlen, dim = x.shape
        tokens = x.reshape(-1, dim)
        scores, chosen, weights = self.router(tokens)
        # Each token's k copies, sorted by expert (stable: in token order within an expert).
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        by_sequence = self.count_routes(flat, bsz)
        counts = by_sequence.sum(0)
        rows = tokens.index_select(0, order // self.top_k)
        if self.run_experts is None:
            out = self.experts(rows, counts)
        else:
            out = self.run_experts(self.experts, rows, counts)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        out = out.index_select(0, inverse).view(-1, self.top_k, out.shape[-1])
        acc = torch.promote_types(out.dtype, torch.float32)  # the weighted sum in float32 or more
        mixed = (out.to(acc) * weights.unsqueeze(-1).to(acc)).sum(1).to(x.dtype)
        if self.shared_expert is not None:
            mixed = mixed + self.shared_expert(tokens)
        if self.training:
            aux = self._record(scores, by_sequence, counts)
            if aux is not None and self.aux_grad_scale is not None:
                mixed = _AuxLossGradient.apply(mixed, aux, self.aux_grad_scale)
        return mixed.view(bsz, seqlen, dim)

    def count_routes(self, flat: torch.Tensor, bsz: int) -> torch.Tensor:
        """Copies routed to each expert in each sequence [bsz, num_experts] (int64) from the
        chosen experts `flat` [bsz x seqlen x top_k]. An instance attribute of the same name
        replaces it: the dry run's balanced routing (`measure/fake_routing.py`)."""
        per_sequence = flat.numel() // bsz
        sequence = torch.arange(flat.numel(), device=flat.device) // per_sequence
        return torch.bincount(
            flat + self.num_experts * sequence, minlength=bsz * self.num_experts
        ).view(bsz, self.num_experts)

    def _record(
        self, scores: torch.Tensor, by_sequence: torch.Tensor, counts: torch.Tensor
    ) -> torch.Tensor | None:
        """This forward's load-balancing loss (None when off), kept with the loads for the
        step unless the forward is a rerun (below) or `recording` is off."""
        aux = None
        if self.aux_loss_coeff:
            balance = sequence_balance_loss(
                scores,
                by_sequence,
                self.top_k,
                normalise=self.normalise_scores,
                sequence_sum=self.sequence_sum,
            )
            aux = self.aux_loss_coeff * balance
        # Activation checkpointing reruns this forward in backward: the same ops (it checks
        # that they save as many tensors), but the step has its loss and loads already.
        if in_backward() or not self.recording:
            return aux
        if self.aux_grad_scale is None:
            self.aux_loss = aux
        elif aux is not None:
            self.aux_loss = aux.detach() + (0 if self.aux_loss is None else self.aux_loss)
        counts = counts.detach()
        self._step_load = counts if self._step_load is None else self._step_load + counts
        return aux

    def take_step_load(self) -> torch.Tensor | None:
        """Tokens routed to each expert [num_experts] (int64) since the last call, or None."""
        load, self._step_load = self._step_load, None
        return load

    def init_weights(self, std: float, out_std: float) -> None:
        self.router.init_weights(std)
        self.experts.init_weights(std, out_std)
        if self.shared_expert is not None:
            self.shared_expert.init_weights(std, out_std)


class _AuxLossGradient(torch.autograd.Function):
    """The identity on a layer's output whose backward also hands `scale` to the layer's
    auxiliary loss, as if `scale x aux` had been added to the loss being differentiated: the
    gradient of a loss the caller never sees (a pipeline stage before the last)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale, ctx.aux = scale, (aux.dtype, aux.device)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        dtype, device = ctx.aux
        return grad, torch.full((), ctx.scale, dtype=dtype, device=device), None


def sequence_balance_loss(
    scores: torch.Tensor,
    by_sequence: torch.Tensor,
    top_k: int,
    *,
    normalise: bool,
    sequence_sum=None,
) -> torch.Tensor:
    """Mean over sequences of sum_i f_i P_i (`MoEShape.aux_loss_coeff`; 1 when balanced).

    `scores` [b * s, E] are the router's, `by_sequence` [b, E] the tokens of each sequence
    routed to each expert; `normalise` rescales each token's scores to sum to 1 (sigmoid
    scores). `sequence_sum` is the `MoE.sequence_sum` seam."""
    bsz, num_experts = by_sequence.shape
    probs = scores / scores.sum(-1, keepdim=True) if normalise else scores
    prob_sums = probs.view(bsz, -1, num_experts).sum(1)
    tokens = torch.full((bsz, 1), float(probs.shape[0] // bsz), device=scores.device)
    stats = torch.cat([by_sequence.float(), prob_sums, tokens], dim=1)
    if sequence_sum is not None:
        stats = sequence_sum(stats)
    counts, prob_sums, tokens = stats.split([num_experts, num_experts, 1], dim=1)
    fractions = counts * (num_experts / (top_k * tokens))
    return (fractions * (prob_sums / tokens)).sum(-1).mean()


# The attention half of the dense plan; the experts' (expert and tensor parallelism) is to come.
MOE_TP_PLAN = {k: v for k, v in TP_PLAN.items() if "feed_forward" not in k}


class MoETransformer(Transformer):
    """`Transformer` with `MoE` feed-forward layers after the first `args.first_k_dense`."""

    tp_plan = MOE_TP_PLAN

    def block(self, args: MoEShape, layer: int) -> TransformerBlock:
        return TransformerBlock(args, MoE(args, layer) if layer in args.moe_layers else None)


def moe_layers(model: nn.Module) -> list[MoE]:
    """The `MoE` modules of `model` (of this rank's pipeline stages), in layer order."""
    return sorted((m for m in model.modules() if isinstance(m, MoE)), key=lambda m: m.layer)


def take_aux_loss(layers: list[MoE]) -> torch.Tensor | None:
    """The sum of the layers' load-balancing losses of the last forward (None when off)."""
    losses = [m.aux_loss for m in layers if m.aux_loss is not None]
    for m in layers:
        m.aux_loss = None
    return torch.stack(losses).sum() if losses else None


def take_step_loads(
    layers: list[MoE], n_layers: int, num_experts: int, device: torch.device
) -> torch.Tensor:
    """[n_layers, num_experts] float64: the tokens each layer routed to each expert since the
    last call; rows of layers not held here (other pipeline stages, dense layers) are zero, so
    an all-reduce over every rank adds each layer's counts from the ranks that hold it."""
    loads = torch.zeros(n_layers, num_experts, dtype=torch.float64, device=device)
    for m in layers:
        load = m.take_step_load()
        if load is not None:
            loads[m.layer] = load.to(device, torch.float64)
    return loads


def update_expert_biases(layers: list[MoE], loads: torch.Tensor) -> None:
    """The auxiliary-loss-free step of each layer from its row of `loads` (the whole step's,
    over every rank), where `bias_update_rate` is on."""
    for m in layers:
        if m.bias_update_rate:
            m.router.update_bias(loads[m.layer], m.bias_update_rate)
