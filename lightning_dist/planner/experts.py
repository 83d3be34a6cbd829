"""A mixture of experts in the planner: what an MoE block holds, keeps and moves on one rank.

`model` is anything with `MoEShape`'s attributes (`lightning_dist/models/shape.py`: num_experts,
top_k, expert_dim, n_shared_experts, first_k_dense, ...); a dense model has no `num_experts`
and every function here answers for it as for a dense block (`is_moe` is False). The layout's
`ep` (expert parallelism) splits each MoE layer's routed experts over `ep` ranks borrowed from
dp_shard x cp; FSDP then shards those experts over the remaining shard_size / ep ranks and the
rest of the model over all shard_size. The MoE layer (router, routed and shared experts) is not
split by tp: every tp rank runs it whole on the whole sequence (gathered under sequence
parallelism; `parallel/expert_parallel.py`), and so do an MoE model's dense MLPs.

Plain Python, like the rest of planner/: no torch.
"""

from __future__ import annotations

MOE_PERMUTE_BYTES = 52
"""Bytes moved per element of the routed copies (top_k x dim per token) by the ops around the
experts in `models/moe.py`, forward and backward: the gather into expert order, the gather
back, the fp32 copy of the experts' outputs and their weighted sum (each op reading its inputs
and writing its output, bf16 rows: 26 bytes forward, as many backward). Counted, not fitted."""


def is_moe(model) -> bool:
    """Does `model` (a shape) route its feed-forward layers to experts?"""
    return getattr(model, "num_experts", 0) > 0 and hasattr(model, "moe_layers")


def expert_degree(layout) -> int:
    """The layout's expert-parallel degree (1 without expert parallelism)."""
    return getattr(layout, "ep", 1)


def layer_is_moe(model, layer: int) -> bool:
    return is_moe(model) and layer in model.moe_layers


def routed_params(model) -> int:
    """Parameters of one MoE layer's routed experts (all of them)."""
    return model.num_experts * model.expert_params()


def layer_params_on_rank(model, layer: int, tp: int, ep: int) -> tuple[float, float, float]:
    """(parameters, routed-expert parameters, linear parameters) of block `layer` on one rank
    of a tp group and an ep group, before FSDP: the attention's projections split by tp, the
    norm scales replicated, an MoE layer's router and shared experts whole and its routed
    experts split by ep; a dense block as `planner.stage_shapes.stage_shapes` counts it. "Linear"
    parameters are what float8 converts (`StageShape.block_linear`): a dense block's
    projections; in an MoE block the attention's and the shared expert's (the grouped experts
    stay in the compute dtype)."""
    d = model.dim
    if not is_moe(model):
        block = (model.block_params() - 2 * d) / tp + 2 * d
        return block, 0.0, block - 2 * d
    if not layer_is_moe(model, layer):  # an MoE model's dense block: its MLP not split by tp
        mlp = 3 * d * model.hidden_dim
        attention = model.layer_params(layer) - mlp - 2 * d
        block = attention / tp + 2 * d + mlp
        return block, 0.0, block - 2 * d
    mlp = model.moe_layer_params()
    attention = model.layer_params(layer) - mlp - 2 * d
    routed = routed_params(model) / ep
    shared = model.n_shared_experts * model.expert_params()
    params = attention / tp + 2 * d + (mlp - routed_params(model)) + routed
    return params, routed, attention / tp + shared


def moe_layer_count(model, first: int, count: int) -> int:
    """MoE blocks among blocks `first` .. `first + count - 1`."""
    return sum(layer_is_moe(model, i) for i in range(first, first + count))


# --- activations ---------------------------------------------------------------------------


def moe_mlp_bytes(model, settings) -> float:
    """Bytes one MoE block's feed-forward part saves for backward per token (in place of
    SwiGLU's 3 h w), from the ops of `models/moe.py`, with w a matmul input's bytes, k = top_k,
    h_e = expert_dim, E = num_experts:

    - the router: its fp32 input copy under bf16 compute (4 d; in 32-true the norm's output is
      it), the softmax's or sigmoid's output, 4 E (sigmoid scores are also normalised for the
      balance loss: 4 E more), the int64 indices of the k chosen experts (a copy of the sort's
      first k columns, which the gather keeps: 8 k), and the routing
      weights, 4 k, with their sum and the normalised copy under `route_norm`, 4 k + 4;
    - the two int64 index tensors of the gathers into expert order and back, 16 k;
    - the routed copies the grouped matmuls read and save: k (d + 3 h_e) w (their input, the
      gate and up projections SwiGLU keeps, and w2's input, the product);
    - the experts' outputs in fp32 for the weighted sum, 4 k d;
    - a shared expert: SwiGLU's 3 h_s w, h_s = n_shared_experts x h_e.

    Checked with saved-tensor hooks and MemTracker on a one-layer model in 32-true
    (`tests/unit/test_planner_experts.py`).

    Under expert parallelism the rows a rank's experts read are the ones the all-to-all
    received: as many on average, so the count is the same."""
    d, k, h_e, E = model.dim, model.top_k, model.expert_dim, model.num_experts
    w = settings.matmul_bytes
    scores = 4 * E * (2 if model.score_func == "sigmoid" else 1) + 8 * k
    weights = 4 * k + (4 * k + 4 if model.route_norm else 0)
    router = (4 * d if w < 4 else 0) + scores + weights
    routed = 16 * k + k * (d + 3 * h_e) * w + 4 * k * d
    return router + routed + 3 * model.n_shared_experts * h_e * w


def moe_mlp_kept_bytes(model, settings, ep: int) -> float:
    """What op-level checkpointing keeps of an MoE block's feed-forward part per token: the
    outputs of its matmuls (the router's, 4 E in fp32; a shared expert's w1, w3 and w2, w (2 h_s
    + d)). The grouped matmuls are not in the policy's list, nor are expert parallelism's
    all-to-alls (c10d's `all_to_all_single`, not the functional collective the policy saves):
    the routed experts and their dispatch run again in backward, whatever `ep`. (op_alternate
    keeps the same here, an approximation: its numbering continues over the router's and the
    shared expert's matmuls.)"""
    d, w = model.dim, settings.matmul_bytes
    h_s = model.n_shared_experts * model.expert_dim
    return 4 * model.num_experts + (w * (2 * h_s + d) if h_s else 0)


# --- compute and communication ---------------------------------------------------------------


def expert_matmuls(model, tokens: float, ep: int) -> list[tuple[float, float, float]]:
    """(M, N, K) of the routed experts' grouped matmuls of one MoE block on one rank for a
    microbatch of `tokens`: w1, w3 and w2 over the k x tokens copies the rank's E / ep experts
    receive, each expert's share M = k x tokens x ep / E rows (balanced routing), as many
    matmuls as the rank has experts."""
    h_e, d = model.expert_dim, model.dim
    rows = model.top_k * tokens * ep / model.num_experts
    return [(rows, h_e, d), (rows, h_e, d), (rows, d, h_e)]


def moe_extra_matmuls(model) -> list[tuple[float, float]]:
    """(N, K) of an MoE block's other matmuls, run over every token: the router and a shared
    expert's three projections."""
    d, h_s = model.dim, model.n_shared_experts * model.expert_dim
    out = [(model.num_experts, d)]
    if h_s:
        out += [(h_s, d), (h_s, d), (d, h_s)]
    return out


def all_to_all_bytes(model, settings, tokens: float, ep: int) -> float:
    """Bytes one rank sends in one all-to-all of an MoE block (the dispatch or the combine)
    for a microbatch of `tokens`: its k x tokens routed copies of d elements, the (ep - 1) / ep
    that go to other ranks (balanced routing). A block runs four per microbatch: dispatch and
    combine forward, their gradients backward; a checkpointed block (full or op) two more."""
    if ep == 1:
        return 0.0
    return (ep - 1) / ep * model.top_k * tokens * model.dim * settings.matmul_bytes
