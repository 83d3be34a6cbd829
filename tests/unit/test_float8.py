"""Float8 training in one process (torchao, emulated on the CPU): which layers convert, and the
numerics against bf16 over 20 optimizer steps. The run through train.py under FSDP2 against one
process is tests/dist/test_parallel3d_dist.py ("fsdp2_float8"); bad values are rows of
tests/unit/test_bad_inputs.py."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from lightning_dist.config import compose_config, model_spec
from lightning_dist.parallel.float8 import apply_float8, check_float8_all_gather

pytest.importorskip("torchao")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return model_spec(compose_config(["debug=fast"])).build()


def test_block_linears_convert_and_the_output_projection_stays():
    from torchao.float8.float8_linear import Float8Linear

    model = apply_float8(_model(), "tensorwise", device_type="cpu")
    kinds = {name: type(m) for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert kinds.pop("output") is nn.Linear
    assert kinds and all(k is Float8Linear for k in kinds.values()), kinds
    assert model.layers["0"].attention.wq.config.emulate  # no CUDA: emulated
    assert (
        apply_float8(_model(), "none", device_type="cpu").layers["0"].attention.wq.__class__
        is nn.Linear
    )


def test_float8_all_gather_refuses_rows_that_do_not_split_evenly():
    """torchao's float8 all-gather fails on FSDP's padded last shard (pytorch/ao#3982): before
    sharding, one line names the first layer whose rows do not split over dp_shard."""
    model = apply_float8(_model(), "tensorwise", device_type="cpu", all_gather=True)
    check_float8_all_gather(model, 2)  # llama_debug's 64, 32 and 128 rows split in two
    with pytest.raises(
        ValueError,
        match=r"dp_shard=3, but layers.0.attention.wq has 64 .*"
        r"set strategy.float8_all_gather=false, or a dp_shard that divides 64",
    ):
        check_float8_all_gather(model, 3)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_losses_stay_within_3_percent_of_bf16_for_20_steps(recipe):
    base = _model().to(torch.bfloat16)
    runs = {"bf16": base, recipe: apply_float8(copy.deepcopy(base), recipe, device_type="cpu")}
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 512, (4, 33), generator=generator) for _ in range(20)]
    losses = {}
    for name, model in runs.items():
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses[name] = []
        for batch in batches:
            logits = model(batch[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses[name].append(loss.item())
    worst = max(abs(a - b) / b for a, b in zip(losses[recipe], losses["bf16"], strict=True))
    print(f"FLOAT8 {recipe} vs bf16 over 20 steps: largest relative difference {worst:.2e}")
    assert worst < 0.03
    assert losses[recipe] != losses["bf16"]  # the float8 casts did change the numbers


def test_a_routers_gate_stays_out_of_float8():
    """The router reads its gate's weight itself, in float32, to choose the experts."""
    from lightning_dist.models.args import MoEArgs
    from lightning_dist.parallel.float8 import keeps_high_precision

    model = MoEArgs(
        dim=64,
        n_layers=2,
        n_heads=4,
        vocab_size=128,
        ffn_hidden_size=128,
        num_experts=16,
        top_k=2,
        expert_hidden_size=64,
        n_shared_experts=1,
    ).build()
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    kept = {n for n, m in linears.items() if keeps_high_precision(m, n)}
    assert {n for n in linears if n.endswith("router.gate")} <= kept
    assert any(n.endswith("shared_expert.w1") for n in linears if n not in kept)
