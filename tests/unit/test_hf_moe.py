"""Hugging Face mixtures of experts <-> our `MoETransformer` (`python -m lightning_dist.checkpoint
import|export`, docs/CHECKPOINTS.md), in one process, on a tiny random `MixtralForCausalLM` built
here (no download), fp32.

The imported checkpoint gives Mixtral's logits and its own first-step loss; `train(cfg)` from it
(`trainer.init_from`) starts at that loss, and its trained checkpoint exports to a directory that
`transformers.AutoModelForCausalLM` loads with our logits. transformers 5.x's in-memory names
(fused `gate_up_proj`) import to the same weights; what our model cannot represent (Qwen2-MoE,
Qwen3-MoE, router noise, another activation; on export shared experts or a trained router bias)
stops with one line and writes nothing.

`train_imported(run, ckpt, overrides, run_dir)` takes the layout as overrides and the runner as
a callable, so the gloo tier runs the same round trip under other layouts (see the module's end).
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
import torch.nn.functional as F

from lightning_dist.checkpoint.cli import main
from lightning_dist.checkpoint.weights import (
    model_overrides,
    open_checkpoint,
    read_weights,
    write_weights_checkpoint,
)
from lightning_dist.models.args import MoEArgs

transformers = pytest.importorskip("transformers", reason="HF conversions need the [hf] extra")

TOLERANCE = 1e-5
VOCAB, SEQ_LEN, BATCH, SEED = 128, 32, 8, 1234  # the runs' data: data=synthetic, seed 1234
# intermediate_size differs from hidden_size, so a transposed expert fails the shape check;
# rope_theta is not Mixtral's default, so a lost value shows in the logits.
TINY_MIXTRAL = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    vocab_size=VOCAB,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    num_local_experts=4,
    num_experts_per_tok=2,
    rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    tie_word_embeddings=False,
)
QUIET = [
    "data=synthetic", f"data.seq_len={SEQ_LEN}", "logger=none", "callbacks=none",
    "trainer.val_check_interval=null", "trainer.memory_by_category_step=0", "report=false",
]  # fmt: skip


def save_hf(model_type: str, path, **config) -> None:
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(model_type, **config)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(path)


def hf_model(hf_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    return model.eval()


def our_model(ckpt):
    info = open_checkpoint(ckpt)
    model = info.args.build()
    model.load_state_dict(read_weights(info))
    return model.eval()


def first_batch() -> torch.Tensor:
    """The first global batch that `train_imported` trains on: [BATCH, SEQ_LEN + 1] token ids."""
    from lightning_dist.lm.data import SyntheticDataModule
    from lightning_dist.lm.sampling import GlobalBatchSampler

    data = SyntheticDataModule(
        vocab_size=VOCAB, seq_len=SEQ_LEN, global_batch_size=BATCH, seed=SEED
    )
    sampler = GlobalBatchSampler(len(data.train_set), BATCH, BATCH, dp_rank=0, dp_size=1, seed=SEED)
    return torch.stack([torch.as_tensor(data.train_set[i]) for i in sampler.step_indices(0, 0)])


@torch.no_grad()
def logits_and_loss(model, batch: torch.Tensor, hf: bool) -> tuple[torch.Tensor, float]:
    """Logits of the batch's inputs and the token-mean cross-entropy of its next tokens."""
    logits = model(input_ids=batch[:, :-1]).logits if hf else model(batch[:, :-1])
    return logits, F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).item()


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(the HF Mixtral directory, its imported checkpoint folder)."""
    root = tmp_path_factory.mktemp("mixtral")
    save_hf("mixtral", root / "hf", **TINY_MIXTRAL)
    assert main(["import", str(root / "hf"), str(root / "step0.ckpt")]) == 0
    return root / "hf", root / "step0.ckpt"


def test_imported_mixtral_has_its_logits_loss_and_counts(imported):
    from lightning_dist.models.hf import HFModelSpec

    hf_dir, ckpt = imported
    args = open_checkpoint(ckpt).args
    assert isinstance(args, MoEArgs)
    assert (args.num_experts, args.top_k, args.expert_dim, args.rope_theta) == (4, 2, 96, 5e5)
    assert (args.score_func, args.route_norm, args.route_scale) == ("softmax", True, 1.0)
    assert (args.n_shared_experts, args.first_k_dense, args.aux_loss_coeff) == (0, 0, 0.0)
    hf, batch = hf_model(hf_dir), first_batch()
    theirs, hf_loss = logits_and_loss(hf, batch, hf=True)
    ours, loss = logits_and_loss(our_model(ckpt), batch, hf=False)
    diff = (ours - theirs).abs().max().item()
    print(f"IMPORT Mixtral: max logit difference {diff:.2e}; loss {loss:.7f} (HF {hf_loss:.7f})")
    assert diff <= TOLERANCE and abs(loss - hf_loss) <= TOLERANCE * hf_loss
    # The planner's count of the HF model (model=hf_llama) is the MoE one, and exact; the
    # manifest's leaves out our router's bias buffer, as the strategies' do.
    spec_args = HFModelSpec(pretrained_path=str(hf_dir)).to_model_args()
    n_params = sum(p.numel() for p in hf.parameters())
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert spec_args.num_params() == manifest["model"]["parameters"] == n_params
    assert spec_args.active_params() < spec_args.num_params()


def test_transformers_in_memory_names_import_to_the_same_weights(imported, tmp_path):
    """transformers 5.x fuses a Mixtral's experts in memory (`mlp.experts.gate_up_proj`, w1's
    rows first; `down_proj`; `mlp.gate`) and writes them per expert; import reads both."""
    from safetensors.torch import save_file

    hf_dir, ckpt = imported
    fused = hf_model(hf_dir).state_dict()
    assert fused["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 2 * 96, 64)
    (tmp_path / "fused").mkdir()
    shutil.copy(hf_dir / "config.json", tmp_path / "fused" / "config.json")
    save_file(fused, str(tmp_path / "fused" / "model.safetensors"))
    assert main(["import", str(tmp_path / "fused"), str(tmp_path / "step0.ckpt")]) == 0
    again, first = (read_weights(open_checkpoint(c)) for c in (tmp_path / "step0.ckpt", ckpt))
    assert again.keys() == first.keys()
    assert all(torch.equal(again[k], first[k]) for k in first)


def train_imported(run, ckpt, overrides: list[str], run_dir) -> dict:
    """3 steps of `train(cfg)` from the imported checkpoint (`trainer.init_from`, with the model
    overrides that import prints) under the layout `overrides`, saving step3.ckpt in `run_dir`;
    `run(overrides, run_dir)` trains and returns the summary."""
    model = model_overrides(open_checkpoint(ckpt).args)
    steps = ["trainer.max_steps=3", "trainer.checkpoint.every_n_train_steps=3"]
    return run([*model, *QUIET, *steps, f"trainer.init_from={ckpt}", *overrides], run_dir)


def check_trained_round_trip(summary: dict, run_dir, hf_dir, out) -> None:
    """The run starts at the HF model's own loss on its first batch, its trained checkpoint
    exports to a Mixtral that `AutoModelForCausalLM` loads with our logits, and training moved
    the weights (the export is not the imported model)."""
    batch = first_batch()
    original, hf_loss = logits_and_loss(hf_model(hf_dir), batch, hf=True)
    loss = summary["losses"][0]
    ckpt = run_dir / "checkpoints" / "step3.ckpt"
    assert main(["export", str(ckpt), "--to", "hf", str(out)]) == 0
    exported = hf_model(out)
    assert type(exported).__name__ == "MixtralForCausalLM"
    theirs, _ = logits_and_loss(exported, batch, hf=True)
    ours, _ = logits_and_loss(our_model(ckpt), batch, hf=False)
    diff, moved = (ours - theirs).abs().max().item(), (ours - original).abs().max().item()
    print(
        f"TRAINED {summary['layout']}: first-step loss {loss:.7f} (HF {hf_loss:.7f}), losses "
        f"{summary['losses']}; exported max logit difference {diff:.2e} (moved {moved:.2e})"
    )
    assert abs(loss - hf_loss) <= TOLERANCE * hf_loss
    assert diff <= TOLERANCE and moved > 100 * TOLERANCE
    assert summary["steps"] == 3


def test_imported_mixtral_trains_and_exports_back(imported, tmp_path, monkeypatch):
    from lightning_dist.config import compose_config
    from lightning_dist.train import train

    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):  # seed_everything sets them: restore
        monkeypatch.setenv(name, "0")

    def run(overrides, run_dir):
        return train(compose_config([*overrides, f"paths.output_dir={run_dir}"]))

    hf_dir, ckpt = imported
    summary = train_imported(run, ckpt, ["strategy=single", "hardware.devices=1"], tmp_path / "run")
    check_trained_round_trip(summary, tmp_path / "run", hf_dir, tmp_path / "hf")


# --- what our model cannot represent: one line, exit 2, nothing written -----------------------


def _mixtral_with(imported, tmp_path, **changes):
    """A copy of the imported Mixtral's directory whose config.json has `changes`."""
    shutil.copytree(imported[0], tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **changes}))
    return tmp_path / "hf"


QWEN = dict(
    TINY_MIXTRAL, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=64
)
BAD_IMPORTS = {
    "qwen2_moe": (lambda imported, tmp: save_hf("qwen2_moe", tmp / "hf", **QWEN) or tmp / "hf",
                  "model_type='qwen2_moe' (q/k/v biases, and a shared expert scaled by "
                  "sigmoid(shared_expert_gate(x))) is not representable by our model"),
    "qwen3_moe": (lambda imported, tmp: save_hf("qwen3_moe", tmp / "hf", **QWEN) or tmp / "hf",
                  "model_type='qwen3_moe' (q_norm and k_norm: an RMSNorm on each head's queries "
                  "and keys) is not representable by our model"),
    "jitter": (lambda imported, tmp: _mixtral_with(imported, tmp, router_jitter_noise=0.1),
               "router_jitter_noise=0.1 is not supported (our router adds no noise in training)"),
    "gelu": (lambda imported, tmp: _mixtral_with(imported, tmp, hidden_act="gelu"),
             "hidden_act='gelu' is not supported; our MLPs are SwiGLU (silu)"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_IMPORTS)
def test_what_our_model_cannot_represent_is_refused_in_one_line(case, imported, tmp_path, capsys):
    make, message = BAD_IMPORTS[case]
    hf_dir = make(imported, tmp_path)
    capsys.readouterr()
    assert main(["import", str(hf_dir), str(tmp_path / "step0.ckpt")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "step0.ckpt").exists()


def test_export_refuses_what_mixtral_cannot_hold_in_one_line(imported, tmp_path, capsys):
    """moe_debug's shared expert, and a router bias that DeepSeek-V3's balancing moved."""
    args = open_checkpoint(imported[1]).args
    shared = dataclasses.replace(args, n_shared_experts=1)
    torch.manual_seed(0)
    write_weights_checkpoint(shared.build().state_dict(), shared, tmp_path / "shared.ckpt", "test")
    state = read_weights(open_checkpoint(imported[1]))
    state["layers.1.feed_forward.router.expert_bias"][2] = 1e-3
    write_weights_checkpoint(state, args, tmp_path / "bias.ckpt", "test")
    for ckpt, message in [
        (
            "shared.ckpt",
            "cannot write as MixtralForCausalLM: model.n_shared_experts=1, and "
            "MixtralForCausalLM has 0",
        ),
        (
            "bias.ckpt",
            "layers.1.feed_forward.router.expert_bias is not zero (trained with "
            "model.bias_update_rate=0.0): MixtralForCausalLM's router has no bias",
        ),
    ]:
        assert main(["export", str(tmp_path / ckpt), "--to", "hf", str(tmp_path / "hf")]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "hf").exists()


def test_init_from_refuses_another_routing_of_the_same_shapes(imported):
    from lightning_dist.checkpoint.init_from import check_init_from

    args = open_checkpoint(imported[1]).args
    with pytest.raises(ValueError, match=r"written for model.route_norm=True, .* has False") as e:
        check_init_from(str(imported[1]), dataclasses.replace(args, route_norm=False))
    assert "model=moe_debug" in str(e.value) and "model.route_norm=true" in str(e.value)


# Expert parallelism (strategy.ep) runs the same round trip on 2 gloo ranks:
# tests/dist/test_hf_moe_dist.py.
