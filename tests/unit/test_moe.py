"""The mixture-of-experts model on one device (lightning_dist/models/moe.py, docs/MOE.md): the
router's top-k and its ties, dropless dispatch against a per-token reference, the grouped matmul
against the per-expert loop, the load-balancing loss whatever the batch split, the bias update,
the step's loads under activation checkpointing, FLOPs, the published flavors' counts on the
meta device, and a short training run held to its stored single-device reference."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from lightning_dist.config import CONF_DIR
from lightning_dist.models.args import MoEArgs
from lightning_dist.models.llama import TransformerBlock
from lightning_dist.models.moe import (
    Router,
    expert_mlp,
    grouped_mm_supported,
    moe_layers,
    run_grouped_experts,
    take_aux_loss,
    take_step_loads,
)

BASELINES = Path(__file__).resolve().parents[1] / "dist" / "baselines.json"


@functools.cache
def _flavor(name: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return instantiate(compose(overrides=[f"+model={name}"]).model)


def moe_args(**changes) -> MoEArgs:
    """moe_debug (through its Hydra schema), with `changes` (validated again)."""
    return dataclasses.replace(_flavor("moe_debug"), **changes)


def build(args: MoEArgs, seed: int = 0, dtype=torch.float32):
    torch.manual_seed(seed)
    return args.build().to(dtype).train()


# --- router -----------------------------------------------------------------------------------


def test_router_takes_the_top_k_in_float32_and_breaks_ties_by_the_lower_index():
    router = Router(moe_args(num_experts=6, top_k=3))
    logits = torch.tensor([[1.0, 2, 2, 0, 2, 1], [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 5]])
    with torch.no_grad():  # token t is the unit vector e_t, so its logits are column t
        router.gate.weight.zero_()
        router.gate.weight[:, :3] = logits.T
    x = torch.eye(64)[:3]
    expected = torch.tensor([[1, 2, 4], [0, 1, 2], [5, 0, 1]])
    for _ in range(3):  # the same every time
        scores, chosen, weights = router(x)
        assert torch.equal(chosen, expected)
    torch.testing.assert_close(scores, logits.softmax(-1))
    torch.testing.assert_close(weights[0], torch.full((3,), 1 / 3))  # renormalised over the 3
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores, chosen, weights = router(x.bfloat16())
    assert scores.dtype == weights.dtype == torch.float32 and torch.equal(chosen, expected)
    # The bias chooses, the scores weigh: expert 5 is pushed out of token 2's choice.
    router.expert_bias[5] = -10.0
    scores, chosen, weights = router(x)
    assert chosen[2].tolist() == [0, 1, 2]
    torch.testing.assert_close(weights[2], torch.full((3,), 1 / 3))
    sigmoid = Router(moe_args(num_experts=6, top_k=3, score_func="sigmoid", route_scale=2.5))
    sigmoid.load_state_dict(router.state_dict())
    sigmoid.expert_bias.zero_()
    _, chosen, weights = sigmoid(x)
    assert torch.equal(chosen, expected)
    top = logits.sigmoid().gather(-1, expected)
    torch.testing.assert_close(weights, 2.5 * top / top.sum(-1, keepdim=True))


def _reference_moe(moe, x):
    """Each token through its chosen experts one by one, weighted, plus the shared expert."""
    tokens = x.reshape(-1, x.shape[-1])
    _, chosen, weights = moe.router(tokens)
    e = moe.experts
    rows = []
    for t, token in enumerate(tokens):
        out = moe.shared_expert(token) if moe.shared_expert is not None else 0
        for j, i in enumerate(chosen[t].tolist()):
            hidden = F.silu(e.w1[i] @ token) * (e.w3[i] @ token)
            out = out + weights[t, j].to(x.dtype) * (e.w2[i] @ hidden)
        rows.append(out)
    return torch.stack(rows).view_as(x)


@pytest.mark.parametrize("skewed", [False, True], ids=["random", "all-to-two-experts"])
def test_dropless_every_token_reaches_its_k_experts(skewed):
    """However uneven the load, each token's k copies reach their experts (none dropped, no
    capacity) and the layer equals the per-token reference."""
    model = build(moe_args(n_layers=1), dtype=torch.float64)
    moe = model.layers["0"].feed_forward
    if skewed:
        moe.router.expert_bias.copy_(torch.tensor([100.0, 100.0, 0.0, 0.0]))
    seen = []

    def recording_seam(experts, rows, counts):  # what expert parallelism would replace
        seen.append((rows.clone(), counts.clone()))
        return experts(rows, counts)

    moe.run_experts = recording_seam
    x = torch.randn(3, 10, 64, dtype=torch.float64)
    out = moe(x)
    ((rows, counts),) = seen
    assert counts.sum() == 30 * moe.top_k and rows.shape[0] == 30 * moe.top_k
    if skewed:
        assert counts.tolist() == [30, 30, 0, 0]
    _, chosen, _ = moe.router(x.reshape(-1, 64))
    expert_of_row = torch.repeat_interleave(torch.arange(4), counts)
    for t in range(30):  # token t's copies are rows of its chosen experts, once each
        places = (rows == x.reshape(-1, 64)[t]).all(-1).nonzero().flatten()
        assert sorted(expert_of_row[places].tolist()) == sorted(chosen[t].tolist())
    torch.testing.assert_close(out, _reference_moe(moe, x), rtol=1e-12, atol=1e-12)


# --- grouped matmul ---------------------------------------------------------------------------


def test_grouped_matmul_matches_the_per_expert_loop_forward_and_backward():
    torch.manual_seed(0)
    counts = torch.tensor([5, 0, 3, 9])  # an expert without tokens too
    x = torch.randn(17, 64, requires_grad=True)
    weights = [
        (torch.randn(4, *shape) * 0.1).requires_grad_() for shape in ((32, 64), (64, 32), (32, 64))
    ]
    assert grouped_mm_supported(x, weights[0]) and grouped_mm_supported(x, weights[1])
    assert not grouped_mm_supported(x.double(), weights[0].double())  # the loop runs float64
    assert not grouped_mm_supported(x[:, :5], weights[0][..., :5])  # rows of 20 bytes
    upstream_grad = torch.randn(17, 64)
    results = {}
    for grouped in (True, False):
        for upstream in ("sum", "random"):  # sum: a gradient of strides [0, 0]
            out = expert_mlp(x, counts, *weights, grouped=grouped)
            loss = out.sum() if upstream == "sum" else (out * upstream_grad).sum()
            results[grouped, upstream] = [out, *torch.autograd.grad(loss, [x, *weights])]
    for upstream in ("sum", "random"):
        for a, b in zip(results[True, upstream], results[False, upstream], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    as64 = [w.detach().double() for w in weights]
    loop64 = expert_mlp(x.detach().double(), counts, *as64, grouped=False)
    torch.testing.assert_close(loop64.float(), results[True, "sum"][0], rtol=1e-4, atol=1e-6)


def test_experts_take_zero_rows_forward_and_backward():
    """An expert-parallel rank may receive no rows: the grouped matmul's backward refuses them
    (torch 2.13), so the loop runs them, and every weight gets a zero gradient (FSDP reduces
    it with the other ranks')."""
    weights = [torch.randn(2, 64, 64, requires_grad=True) for _ in range(3)]
    x = torch.randn(0, 64, requires_grad=True)
    out = run_grouped_experts(x, torch.zeros(2, dtype=torch.int64), *weights)
    out.sum().backward()
    assert out.shape == (0, 64)
    assert all(w.grad is not None and not w.grad.any() for w in weights)


# --- load balancing ---------------------------------------------------------------------------


@pytest.mark.parametrize("score_func", ["softmax", "sigmoid"])
def test_aux_loss_is_the_same_for_the_batch_in_1_2_or_4_pieces(score_func):
    """What makes every layout one device's: data-parallel ranks, gradient accumulation and
    pipeline microbatches each see a piece of whole sequences, and Lightning's mean over the
    pieces (each loss / n) gives the whole batch's value and gradient."""
    model = build(moe_args(n_layers=2, score_func=score_func))
    layers = moe_layers(model)
    tokens = torch.randint(0, 512, (8, 24), generator=torch.Generator().manual_seed(1))
    values, grads = [], []
    for pieces in (1, 2, 4):
        model.zero_grad()
        total = 0.0
        for part in tokens.chunk(pieces):
            model(part)
            aux = take_aux_loss(layers) / pieces
            aux.backward()
            total += aux.item()
        values.append(total)
        grads.append(torch.cat([m.router.gate.weight.grad.flatten() for m in layers]))
    assert max(values) - min(values) < 1e-6 and values[0] > 0
    for grad in grads[1:]:
        torch.testing.assert_close(grad, grads[0], rtol=1e-5, atol=1e-9)


def test_a_sequence_split_over_ranks_needs_only_the_sequence_sum_seam():
    """Context parallelism splits each sequence: summing the per-sequence statistics over the
    pieces (`MoE.sequence_sum`, here the other half's values) gives the whole sequence's loss."""
    moe = build(moe_args(n_layers=1)).layers["0"].feed_forward
    x = torch.randn(4, 32, 64)
    moe(x)
    whole = moe.aux_loss
    first = []
    moe.sequence_sum = lambda stats: first.append(stats.detach()) or stats
    moe(x[:, :16])
    moe.sequence_sum = lambda stats: stats + first[0]
    moe(x[:, 16:])
    torch.testing.assert_close(moe.aux_loss, whole, rtol=1e-6, atol=0)


def test_bias_update_follows_the_sign_of_the_load_gap():
    router = Router(moe_args())
    router.update_bias(torch.tensor([10.0, 2.0, 4.0, 4.0]), 1e-3)  # mean 5
    torch.testing.assert_close(router.expert_bias, torch.tensor([-1e-3, 1e-3, 1e-3, 1e-3]))
    router.update_bias(torch.tensor([30.0, 6.0, 12.0, 12.0]), 1e-3)  # any multiple: same step
    router.update_bias(torch.tensor([5.0, 5.0, 5.0, 5.0]), 1e-3)  # balanced: no change
    torch.testing.assert_close(router.expert_bias, torch.tensor([-2e-3, 2e-3, 2e-3, 2e-3]))
    assert "gate.weight" in router.state_dict() and "expert_bias" in router.state_dict()


def test_step_loads_count_every_micro_batch_once_under_activation_checkpointing():
    """The bias update reads the whole step's loads: every micro-batch adds to them, and the
    forward that checkpointing reruns in backward does not; the aux gradient is unchanged."""
    from lightning_dist.parallel.activation_checkpoint import apply_activation_checkpointing

    args = moe_args(n_layers=2)
    tokens = torch.randint(0, 512, (4, 16), generator=torch.Generator().manual_seed(2))
    results = []
    # Without early stopping the recompute runs the whole block, past the MoE's bookkeeping.
    for checkpointed, early_stop in ((False, True), (True, True), (True, False)):
        model = build(args)
        if checkpointed:
            apply_activation_checkpointing(model, (TransformerBlock,), every_n=1)
        layers = moe_layers(model)
        with torch.utils.checkpoint.set_checkpoint_early_stop(early_stop):
            for part in tokens.chunk(2):  # two micro-batches of one step
                logits = model(part)
                (logits.logsumexp(-1).mean() + take_aux_loss(layers)).backward()
        loads = take_step_loads(layers, args.n_layers, args.num_experts, torch.device("cpu"))
        results.append((loads, layers[0].router.gate.weight.grad.clone()))
        assert loads.sum(-1).tolist() == [4 * 16 * args.top_k] * 2  # every token, k times
    for loads, grad in results[1:]:
        assert torch.equal(loads, results[0][0])
        torch.testing.assert_close(grad, results[0][1])


# --- counts and FLOPs -------------------------------------------------------------------------


def test_train_flops_are_six_times_the_active_parameters_the_counter_sees():
    """float64 runs the per-expert loop, whose matmuls FlopCounterMode counts (it has no formula
    for the grouped matmul): each token's FLOPs are those of its top-k experts only."""
    args = moe_args(first_k_dense=1)
    model = build(args, dtype=torch.float64)
    tokens = torch.randint(0, args.vocab_size, (2, 128))
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        model(tokens).sum().backward()
    measured = counter.get_total_flops() / tokens.numel()
    assert measured == pytest.approx(args.train_flops_per_token(128), rel=1e-9)
    assert args.active_params() < args.num_params() == sum(p.numel() for p in model.parameters())


MLA_ATTENTION = 187_107_328
"""DeepSeek-V3's attention weights per layer (q_a, q_a norm, q_b, kv_a, kv_a norm, kv_b, o)."""


@pytest.mark.parametrize(
    ("flavor", "total", "active"),
    [
        ("mixtral_8x7b", 46_702_792_704, 12_879_925_248),
        ("deepseek_v3", 666_273_018_880, 32_798_897_152),
    ],
)
def test_published_flavors_build_on_meta_with_their_counts(flavor, total, active):
    args = _flavor(flavor)
    with torch.device("meta"):
        model = args.build()
    assert all(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert sum(p.numel() for p in model.parameters()) == args.num_params() == total
    layers = moe_layers(model)
    assert [m.layer for m in layers] == list(args.moe_layers)
    idle = sum(sum(p.numel() for p in m.experts.parameters()) for m in layers)
    idle = idle * (args.num_experts - args.top_k) // args.num_experts
    assert total - idle == args.active_params() == active
    if flavor == "mixtral_8x7b":  # published: 46.7B, 12.9B active
        assert (round(total / 1e9, 1), round(active / 1e9, 1)) == (46.7, 12.9)
    else:  # published 671B and 37B, with MLA, whose attention is larger than ours
        ours = args.block_params() - args.moe_layer_params() - 2 * args.dim
        with_mla = args.n_layers * (MLA_ATTENTION - ours)
        assert round((total + with_mla) / 1e9) == 671
        assert abs((active + with_mla) / 37e9 - 1) < 0.02
        assert model.layers["2"].feed_forward.w1.out_features == 18432  # first_k_dense=3


# --- a training run ---------------------------------------------------------------------------

REFERENCE = "moe_debug_lr1e-2"
MOE_STORED_MATCH = 1e-4
"""How close a fresh run of the MoE reference comes to the stored one across CPUs: the bound of
the layouts held to it. Other instruction sets take other matmul kernels, and ten steps at lr
1e-2 through the router and the grouped matmul carry the difference further: an AVX-512 EPYC
differs from the file (written elsewhere) by 5.8e-6, an "Intel Xeon Processor" VM by 5.7e-5 (the
largest step; measured 2026-12-04 and 2026-12-06); bitwise on the machine that wrote it. On such
a machine the layouts' 1e-4 against the file includes this difference."""


def test_moe_debug_trains_on_one_device_as_its_stored_reference(compose, fitted_trainers):
    """train(cfg) of the stored reference (tests/dist/baselines.py) in this process: the same
    losses (which keeps the reference honest), a falling loss, the experts' loads in
    summary.json and the metrics, the bias moved by the sign rule."""

    from lightning_dist.run.loggers import METRICS_CSV
    from lightning_dist.run.parity_runs import max_relative_difference
    from lightning_dist.run.report_pages import markdown_summary
    from lightning_dist.train import train

    trainers = fitted_trainers
    stored = json.loads(BASELINES.read_text())[REFERENCE]
    quiet = ["~callbacks.comm", "trainer.memory_by_category_step=0", "report=false"]
    summary = train(compose(*stored["overrides"], *quiet))
    for key in ("losses", "val_losses"):
        assert max_relative_difference(summary[key], stored[key]) <= MOE_STORED_MATCH, key
    losses = summary["losses"]
    assert losses[-1] < losses[0] - 0.5
    moe, args = summary["moe"], trainers[0].lightning_module.model_spec
    routed = args.top_k * summary["global_batch_size"] * summary["seq_len"]
    assert [sum(row) for row in moe["tokens_per_expert"]] == [routed] * args.n_layers
    assert len(moe["aux_losses"]) == len(losses) and all(a > 0 for a in moe["aux_losses"])
    assert all(v >= 1 for v in moe["imbalance"]) and moe["max_imbalance"] == max(moe["imbalance"])
    assert moe["active_parameters"] == args.active_params() < summary["parameters"]
    for m in moe_layers(trainers[0].lightning_module.model):
        steps = m.router.expert_bias / args.bias_update_rate  # whole steps of +-rate
        assert steps.abs().max() > 0
        torch.testing.assert_close(steps, steps.round(), rtol=0, atol=1e-3)
    columns = (Path(trainers[0].default_root_dir) / METRICS_CSV).read_text().splitlines()[0]
    assert "train/aux_loss" in columns and "moe/imbalance_layer3" in columns
    table = markdown_summary(summary, [])
    assert "| active parameters |" in table and "| expert imbalance (max/mean) |" in table
