"""Supervised fine-tuning data (lightning_dist/lm/chat.py) in one process: the default template's
loss mask covers exactly the assistant's tokens; the module's loss over a global batch, in one
micro-batch or two, equals cross-entropy over the trained targets computed by hand; prompt
positions get no gradient; a tokenizer folder's chat template is used through Hugging Face's
`apply_chat_template`. (dp2 and cp2 against one process: tests/dist/test_sft_dist.py; bad
records: tests/unit/test_bad_inputs.py.)"""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn.functional as F

from lightning_dist.lm.chat import (
    ChatRenderer,
    conversation,
    encode_conversation,
    load_chat_template,
)
from lightning_dist.lm.data import MixtureDataModule
from lightning_dist.lm.module import IGNORE, CausalLM
from lightning_dist.lm.tokenizer import ByteTokenizer
from lightning_dist.models.args import ModelArgs
from lightning_dist.run.errors import ConfigError

ARGS = ModelArgs(
    dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=260, ffn_hidden_size=64, max_seq_len=64
)


def chat_file(path, n: int = 40):
    """`n` chat records, half of them prompt/response, of different lengths."""
    with open(path, "w") as f:
        for i in range(n):
            if i % 2:
                record = {"prompt": f"add {i} and {i}", "response": f"{2 * i}"}
            else:
                record = {"messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": f"say {i}" + "!" * (i % 7)},
                    {"role": "assistant", "content": f"{i}" * (1 + i % 5)},
                ]}  # fmt: skip
            f.write(json.dumps(record) + "\n")
    return path


def test_default_template_trains_the_assistant_turn_and_its_end():
    pieces = ChatRenderer(None, None).pieces(
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "unanswered"},
        ],
        "x",
    )
    tok = ByteTokenizer()
    ids, mask = encode_conversation(pieces, tok)
    assert tok.decode(ids) == "<|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|>\n"
    assert tok.decode(ids[mask]) == "Hello<|end|>\n" and ids[-1] == tok.eos_id and mask[-1]


def _module():
    torch.manual_seed(0)
    module = CausalLM(ARGS)
    module.configure_model()
    return module


def _hand_loss(module, batches) -> torch.Tensor:
    """Cross-entropy over the trained targets of all `batches`, by hand."""
    losses = []
    for batch in batches:
        tokens, mask = batch["tokens"], batch["loss_mask"][:, 1:].bool()
        logits = module.model(tokens[:, :-1])
        per_token = F.cross_entropy(
            logits.flatten(0, 1).float(), tokens[:, 1:].flatten(), reduction="none"
        )
        losses.append(per_token[mask.flatten()])
    return torch.cat(losses).mean()


@pytest.mark.parametrize(("micro", "mixed"), [(4, False), (2, False), (2, True)])
def test_loss_is_the_mean_over_trained_targets_of_the_global_batch(tmp_path, micro, mixed):
    sources = [{"path": str(chat_file(tmp_path / "chat.jsonl")), "format": "chat"}]
    if mixed:  # a text source beside it: its windows trained on whole
        (tmp_path / "prose.txt").write_text("the quick brown fox jumps over the lazy dog. " * 60)
        sources.append({"path": str(tmp_path / "prose.txt"), "weight": 1.0})
    dm = MixtureDataModule(
        sources=sources, seq_len=32, global_batch_size=4, micro_batch_size=micro, val_fraction=0.2
    )
    loader = iter(dm.train_dataloader())
    batches = [next(loader) for _ in range(4 // micro)]  # the first step's global batch
    if mixed:
        rows = torch.cat([b["loss_mask"] for b in batches]).all(dim=1)
        assert 0 < int(rows.sum()) < 4  # text windows (every target trained) beside chat's
        assert {float(b["loss_scale"][0]) for b in batches} == {float(batches[0]["loss_scale"][0])}
    module = _module()
    with torch.no_grad():
        mean = sum(module._loss(b)[0] for b in batches) / len(batches)
        hand = _hand_loss(module, batches)
    trained = sum(int(b["loss_mask"][:, 1:].sum()) for b in batches)
    assert 0 < trained < 4 * 32  # some targets are prompt, some response
    print(f"micro={micro}: module {float(mean):.8f}, by hand {float(hand):.8f}")
    assert torch.allclose(mean, hand, rtol=1e-6, atol=0)


def test_prompt_positions_get_no_gradient():
    module = _module()
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(2, 17, dtype=torch.bool)
    mask[:, 9:] = True  # the first 8 targets are prompt
    batch = {"tokens": tokens, "loss_mask": mask}
    logits = module.model(tokens[:, :-1]).detach().requires_grad_()
    module._loss(batch)  # sets the batch's scale, as in training
    targets = tokens[:, 1:].masked_fill(~mask[:, 1:], IGNORE)
    module.loss_fn(logits, targets).backward()
    prompt, response = logits.grad[:, :8], logits.grad[:, 8:]
    print(
        f"max |grad| at prompt positions {prompt.abs().max():.3e}, at response "
        f"{response.abs().max():.3e}"
    )
    assert torch.equal(prompt, torch.zeros_like(prompt)) and response.abs().min(-1).values.all()


def test_a_tokenizer_folder_chat_template_is_used(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    vocab = {chr(c): c - 32 for c in range(32, 127)} | {"[UNK]": 95}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    tok.save(str(tmp_path / "tokenizer.json"))
    template = (
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    found = load_chat_template(str(tmp_path / "tokenizer.json"))
    pieces = ChatRenderer(found, str(tmp_path / "tokenizer.json")).pieces(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "x"
    )
    assert pieces == [("[user]hi[assistant]", False), ("yo", True)]


@pytest.mark.parametrize(
    ("record", "expect"),
    [
        ([{"role": "user", "content": "hi"}], "a JSON list, not a chat record"),
        ({"prompt": "hi"}, "field 'response' is missing or not a string"),
        ({"messages": [{"role": "user"}]}, "message 0 is not a {role, content} object"),
        ({"messages": []}, "'messages' is list, not a non-empty list"),
    ],
)
def test_bad_chat_records_are_named_by_file_and_line(record, expect):
    # The rows that run train() are in tests/unit/test_bad_inputs.py; these are the rest.
    with pytest.raises(ConfigError, match=re.escape(f"f.jsonl:3: {expect}")):
        conversation(record, "f.jsonl:3")


def test_skip_bad_records_leaves_bad_chat_records_out_with_a_count(tmp_path, capsys):
    from lightning_dist.lm.chat import read_conversations

    good = json.dumps({"prompt": "hi", "response": "yo"})
    path = tmp_path / "chat.jsonl"
    path.write_text(f"{good}\n{{not json\n{json.dumps({'prompt': 'hi'})}\n{good}\n")
    with pytest.raises(ConfigError, match=r"chat.jsonl:2: not valid JSON .* data.skip_bad_records"):
        read_conversations(path)
    kept = read_conversations(path, skip_bad_records=True)
    assert [where.rsplit(":", 1)[1] for where, _ in kept] == ["1", "4"]
    assert "skipped 2 bad chat records (the first: " in capsys.readouterr().err
