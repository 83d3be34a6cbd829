"""`python -m lightning_dist.checkpoint` in one process: export to and import from Hugging Face,
consolidate, inspect, and the checks of `trainer.init_from`.

Every model is built here with random weights (no download). Imported Llama and Mistral weights
give our Transformer the logits of the HF model, and exported weights give LlamaForCausalLM ours
(both within 1e-5); the consolidated file equals the state dict; an imported checkpoint is
verified like a trained one but is not resumable, and every tool refuses a changed shard; mistakes
stop with one line. (The gloo runs are tests/dist/test_checkpoint_tools_dist.py.)
"""

from __future__ import annotations

import json

import pytest
import torch

from lightning_dist.checkpoint.cli import main
from lightning_dist.checkpoint.weights import (
    open_checkpoint,
    read_weights,
    write_weights_checkpoint,
)
from lightning_dist.models.args import ModelArgs

transformers = pytest.importorskip("transformers", reason="HF conversions need the [hf] extra")

TOLERANCE = 1e-5
TINY_HF = dict(
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=512,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
# rope_theta other than the default, so a lost value shows in the logits.
HF_MODELS = {"llama": {"rope_theta": 500000.0}, "mistral": {}}


def tokens(vocab: int = 512) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 48), generator=torch.Generator().manual_seed(0))


def our_logits(ckpt) -> torch.Tensor:
    info = open_checkpoint(ckpt)
    model = info.args.build()
    model.load_state_dict(read_weights(info))
    with torch.no_grad():
        return model.eval()(tokens(info.args.vocab_size))


def hf_logits(hf_dir) -> tuple[str, torch.Tensor]:
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        return type(model).__name__, model.eval()(input_ids=tokens()).logits


def save_hf_model(model_type: str, path) -> None:
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, **TINY_HF, **HF_MODELS[model_type])
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """model_type -> (HF directory, our imported checkpoint folder)."""
    out = {}
    for model_type in HF_MODELS:
        root = tmp_path_factory.mktemp(model_type)
        save_hf_model(model_type, root / "hf")
        assert main(["import", str(root / "hf"), str(root / "step0.ckpt")]) == 0
        out[model_type] = (root / "hf", root / "step0.ckpt")
    return out


@pytest.mark.parametrize("model_type", HF_MODELS)
def test_import_gives_the_hf_logits(model_type, imported):
    hf_dir, ckpt = imported[model_type]
    name, expected = hf_logits(hf_dir)
    diff = (our_logits(ckpt) - expected).abs().max().item()
    print(f"IMPORT {name}: max logit difference {diff:.2e}")
    assert diff <= TOLERANCE
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["step"] == 0 and manifest["model"]["rope_theta"] == pytest.approx(
        HF_MODELS[model_type].get("rope_theta", 10000.0)
    )


def test_export_gives_our_logits(tmp_path):
    # Tied embeddings and grouped-query attention: the two places where names are not 1:1.
    args = ModelArgs(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=512,
        ffn_hidden_size=96,
        max_seq_len=128,
        rope_theta=1234.0,
        tie_embeddings=True,
    )
    torch.manual_seed(1)
    write_weights_checkpoint(args.build().state_dict(), args, tmp_path / "step0.ckpt", "test")
    assert main(["export", str(tmp_path / "step0.ckpt"), "--to", "hf", str(tmp_path / "hf")]) == 0
    name, logits = hf_logits(tmp_path / "hf")
    diff = (our_logits(tmp_path / "step0.ckpt") - logits).abs().max().item()
    print(f"EXPORT {name} (tied): max logit difference {diff:.2e}")
    assert name == "LlamaForCausalLM" and diff <= TOLERANCE


TEXT = "def f(x):\n\treturn x  + 1  # héllo ☃ 𝄞\n"


def test_export_writes_the_tokenizer_the_model_trained_with(tmp_path, capsys):
    """A checkpoint of a run on text (data.tokenizer null: bytes) exports tokenizer files that
    transformers.AutoTokenizer loads and that give our tokenizer's ids, and the end-of-document
    id in config.json and generation_config.json; a tokenizer.json given by --tokenizer too."""
    from omegaconf import OmegaConf

    from lightning_dist.lm.tokenizer import ByteTokenizer, HFTokenizer
    from tests.unit.test_data import make_hf_tokenizer

    args = ModelArgs(
        dim=32,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        vocab_size=320,
        ffn_hidden_size=64,
        max_seq_len=64,
    )
    ckpt = tmp_path / "run" / "checkpoints" / "step0.ckpt"
    write_weights_checkpoint(args.build().state_dict(), args, ckpt, "test")
    (tmp_path / "run" / ".hydra").mkdir()
    OmegaConf.save({"data": {"tokenizer": None}}, tmp_path / "run" / ".hydra" / "config.yaml")
    assert main(["export", str(ckpt), "--to", "hf", str(tmp_path / "hf")]) == 0
    assert "tokenizer: byte-level (the run's data.tokenizer)" in capsys.readouterr().out
    ours = ByteTokenizer()
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = hf(TEXT)["input_ids"]
    assert ids == ours.encode(TEXT).tolist() and hf.eos_token_id == ours.eos_id == 256
    assert hf.decode([*ids, 256], skip_special_tokens=True) == ours.decode([*ids, 256]) == TEXT
    # Read back as data.tokenizer, the exported file is the byte tokenizer again.
    again = HFTokenizer(tmp_path / "hf" / "tokenizer.json")
    assert again.encode(TEXT).tolist() == ids and again.eos_id == 256
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert config["eos_token_id"] == generation["eos_token_id"] == 256
    assert config["bos_token_id"] is None  # none in training, not LlamaConfig's default of 1
    assert transformers.GenerationConfig.from_pretrained(tmp_path / "hf").eos_token_id == 256
    # A Hugging Face tokenizer.json, given on the command line.
    words = make_hf_tokenizer(tmp_path / "tokenizer.json")
    out = tmp_path / "hf_words"
    assert main(["export", str(ckpt), "--to", "hf", str(out), "--tokenizer", str(words)]) == 0
    ours, hf = HFTokenizer(words), transformers.AutoTokenizer.from_pretrained(out)
    assert hf("the lazy fox")["input_ids"] == ours.encode("the lazy fox").tolist()
    assert hf.eos_token == "<|endoftext|>" and hf.eos_token_id == ours.eos_id
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == ours.eos_id
    assert (
        main(["export", str(ckpt), "--to", "hf", str(tmp_path / "x"), "--tokenizer", "nope"]) == 2
    )
    assert "'nope' does not exist (--tokenizer); give --tokenizer PATH, or none" in (
        capsys.readouterr().err
    )


def test_consolidate_writes_the_model_state(imported, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    _, ckpt = imported["mistral"]
    out = tmp_path / "model.safetensors"
    assert main(["consolidate", str(ckpt), str(out)]) == 0
    state = load_file(str(out))
    info = open_checkpoint(ckpt)
    model = info.args.build()
    model.load_state_dict(state)  # strict: every name of our model, nothing else
    assert all(torch.equal(state[k], v) for k, v in read_weights(info).items())
    with safe_open(str(out), "pt") as f:
        assert json.loads(f.metadata()["lightning_dist.model"])["dim"] == 64


def test_inspect_shows_model_layout_step_and_sizes(imported, capsys):
    _, ckpt = imported["llama"]
    assert main(["inspect", str(ckpt)]) == 0
    text = capsys.readouterr().out
    assert "lightning_dist.checkpoint v1" in text
    assert "step        0" in text
    assert "n_kv_heads=2" in text and "rope_theta=500000" in text
    assert "213,568 in 39 tensors (float32)" in text
    assert "none (weights only)" in text
    assert "__0_0.distcp" in text
    assert len(text.splitlines()) == 8


def test_inspect_reads_the_manifest_of_a_model_that_is_not_ours(imported, tmp_path, capsys):
    """A checkpoint of model=hf_llama records the HF spec in its manifest.json, not ModelArgs:
    inspect described it as "unknown (no manifest, no run config)". The manifest is what the
    strategies write (`checkpoint_hooks._model_args`)."""
    import shutil
    from types import SimpleNamespace

    from lightning_dist.checkpoint.manifest import MANIFEST, read_manifest, write_manifest
    from lightning_dist.models.hf import HFModelSpec
    from lightning_dist.strategies.checkpoint_hooks import _model_args

    ckpt = tmp_path / "step5.ckpt"
    shutil.copytree(imported["llama"][1], ckpt)
    fields = {k: v for k, v in read_manifest(ckpt).items() if k not in ("format", "version")}
    spec = HFModelSpec(config={"model_type": "llama", **TINY_HF})
    for model, shown in [
        (
            _model_args(SimpleNamespace(model_spec=spec)),
            "Hugging Face llama hidden_size=64 num_hidden_layers=4 num_attention_heads=4 "
            "num_key_value_heads=2 intermediate_size=128 vocab_size=512 "
            "max_position_embeddings=256 (model=hf_llama, manifest.json)",
        ),
        ({}, "not recorded in manifest.json (a model without a lightning_dist model_spec)"),
    ]:
        (ckpt / MANIFEST).unlink()
        write_manifest(ckpt, {**fields, "model": model})
        assert main(["inspect", str(ckpt)]) == 0
        text = capsys.readouterr().out
        assert f"model       {shown}\n" in text and "no manifest" not in text, text
    assert main(["export", str(ckpt), "--to", "hf", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds no lightning_dist Transformer: its manifest.json records another" in err, err


def test_an_imported_checkpoint_is_verified_named_like_a_trained_one_and_not_resumable(
    imported, tmp_path, capsys
):
    import shutil

    from lightning_dist.checkpoint.format import WEIGHTS, tensor_shapes
    from lightning_dist.checkpoint.manifest import open_manifest
    from lightning_dist.checkpoint.store import is_complete, latest_checkpoint, verify_checkpoint

    _, ckpt = imported["llama"]
    open_manifest(ckpt)  # version and every file's hash, as a trained checkpoint
    assert all(k.startswith(WEIGHTS) for k in tensor_shapes(ckpt))  # state_dict.model.<name>
    assert not is_complete(ckpt)
    point = latest_checkpoint(ckpt.parent)
    assert point.path is None and point.skipped == [] and point.weights_only == [ckpt]
    assert f"holds weights only; start from it with trainer.init_from={ckpt}" in point.describe()
    with pytest.raises(
        ValueError, match=r"holds weights only; start from it with trainer.init_from="
    ) as err:
        verify_checkpoint(ckpt, open_checkpoint(ckpt).args)
    assert "\n" not in str(err.value)
    # A changed shard is refused by every tool before anything is read.
    tampered = tmp_path / "step0.ckpt"
    shutil.copytree(ckpt, tampered)
    shard = next(tampered.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-1] + bytes([shard.read_bytes()[-1] ^ 1]))
    for argv in (
        ["inspect", str(tampered)],
        ["consolidate", str(tampered), str(tmp_path / "x")],
        ["export", str(tampered), "--to", "hf", str(tmp_path / "hf")],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "does not match its hash" in err and len(err.strip().splitlines()) == 1, err
    from lightning_dist.checkpoint.init_from import check_init_from

    with pytest.raises(ValueError, match="does not match its hash"):
        check_init_from(str(tampered), open_checkpoint(ckpt).args)


def run_cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own usage errors
        return e.code


@pytest.mark.parametrize(
    "argv, message",
    [
        (["inspect", "/nonexistent/step3.ckpt"], "does not exist"),
        (["inspect", "."], "is not a checkpoint folder (no .metadata)"),
        (["export", ".", "--to", "gguf", "x"], "invalid choice: 'gguf'"),
        (["import", ".", "out.ckpt"], "is not a Hugging Face safetensors model directory"),
    ],
)
def test_mistakes_are_one_line(argv, message, capsys):
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_qwen2_is_refused_with_the_alternative(tmp_path, capsys):
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("qwen2", **TINY_HF)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "hf")
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "step0.ckpt")]) == 2
    err = capsys.readouterr().err
    assert "model_type='qwen2' (q/k/v biases)" in err and "model=hf_llama" in err
    assert not (tmp_path / "step0.ckpt").exists()


def test_init_from_names_the_model_of_a_mismatched_checkpoint(imported):
    from lightning_dist.checkpoint.init_from import check_init_from

    _, ckpt = imported["llama"]
    with pytest.raises(ValueError, match=r"tok_embeddings.weight of shape \(512, 64\)") as err:
        check_init_from(str(ckpt), ModelArgs(dim=64, vocab_size=320, n_layers=4))
    assert "model.rope_theta=500000.0" in str(err.value)
    # Same shapes, another function: the rotary base differs.
    with pytest.raises(ValueError, match=r"written for model.rope_theta=500000.0, .* has 10000.0"):
        same_shapes = ModelArgs(dim=64, n_kv_heads=2, vocab_size=512, ffn_hidden_size=128)
        check_init_from(str(ckpt), same_shapes)


# --- gloo processes: train.py from the imported weights, and export of a trained checkpoint ---

# Every layout for each model, but FSDP1 (its own loading path) for one model only.
