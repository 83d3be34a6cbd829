"""Supervised fine-tuning data: chat records as token windows with a loss mask.

A record of a `format: chat` source (docs/SFT.md) is one JSON Lines object, either
`{"messages": [{"role": ..., "content": ...}, ...]}` (roles in `ROLES`, at least one
`assistant` turn) or `{"prompt": ..., "response": ...}` (one user turn and one assistant turn).
It is rendered with the tokenizer's chat template when its folder has one (`tokenizer_config.json`
or `chat_template.jinja` beside the tokenizer.json), else with `DEFAULT_TEMPLATE`; the tokens of
each assistant turn are the ones trained on (`loss_mask` 1), the rest are context (0).

The conversations are laid end to end, each ended by the tokenizer's end-of-text id (trained on
when it ends an assistant turn: the model learns to stop), and cut into windows of
`seq_len + 1` like text. Each window carries its `loss_mask` beside its tokens and documents, so
it is cut, packed and split over context-parallel ranks with them.
"""

from __future__ import annotations

import bisect
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import ConcatDataset, Dataset

from lightning_dist.data.records import MAX_LINE_BYTES, open_stream
from lightning_dist.lm.datasets import TokenWindows
from lightning_dist.lm.mixture import MixtureSampler
from lightning_dist.lm.token_cache import file_sizes
from lightning_dist.options.data import DataSource
from lightning_dist.runtime.console import print_line
from lightning_dist.runtime.refusal import ConfigError

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")
DEFAULT_TEMPLATE = "<|{role}|>\n{content}<|end|>\n"
"""Each message of a conversation when the tokenizer has no chat template (the byte-level
tokenizer): e.g. `<|user|>\\nHi<|end|>\\n<|assistant|>\\nHello<|end|>\\n`. Of an assistant
turn, `<|assistant|>\\n` is context and `Hello<|end|>\\n` is trained on."""
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "tokenizer_config.json")


def conversation(record: Any, where: str) -> list[dict[str, str]]:
    """The messages of one chat record, checked: ConfigError naming `where` (file:line) for a
    record that is not an object, has neither `messages` nor `prompt`/`response`, a message
    that is not {role, content} with a known role and string content, or no assistant turn."""
    if not isinstance(record, dict):
        raise ConfigError(
            f"{where}: a JSON {type(record).__name__}, not a chat record (an "
            "object with messages, or prompt and response)"
        )
    if "messages" in record:
        messages = record["messages"]
    elif "prompt" in record or "response" in record:
        for key in ("prompt", "response"):
            if not isinstance(record.get(key), str):
                raise ConfigError(
                    f"{where}: field {key!r} is missing or not a string; a "
                    "prompt/response record needs both as strings"
                )
        messages = [
            {"role": "user", "content": record["prompt"]},
            {"role": "assistant", "content": record["response"]},
        ]
    else:
        fields = ", ".join(map(repr, list(record)[:20])) or "none"
        raise ConfigError(
            f"{where}: no field 'messages' nor 'prompt'/'response' (the record's fields: {fields})"
        )
    if not isinstance(messages, list) or not messages:
        raise ConfigError(
            f"{where}: 'messages' is {type(messages).__name__}, not a non-empty "
            "list of {role, content} messages"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise ConfigError(
                f"{where}: message {i} is not a {{role, content}} object with string content"
            )
        if message.get("role") not in ROLES:
            raise ConfigError(
                f"{where}: message {i} has role {message.get('role')!r}, not one "
                f"of {', '.join(ROLES)}"
            )
    if not any(m["role"] == "assistant" for m in messages):
        raise ConfigError(
            f"{where}: no assistant turn, so nothing to train on; every record "
            "needs one (role 'assistant')"
        )
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def read_conversations(
    path: Path, *, skip_bad_records: bool = False
) -> list[tuple[str, list[dict[str, str]]]]:
    """(file:line, messages) of every record of a JSON Lines file (.gz/.zst decompressed). A
    bad record stops the read naming file:line, unless `skip_bad_records`: then it is left
    out, and one `warning:` line gives the count and the first."""
    out, skipped = [], []
    with open_stream(path) as stream:
        lineno = 0
        while line := stream.readline(MAX_LINE_BYTES + 1):
            lineno += 1
            where = f"{path}:{lineno}"
            if len(line) > MAX_LINE_BYTES or not line.strip():
                if line.strip():
                    raise ConfigError(f"{where}: a record over {MAX_LINE_BYTES >> 20} MiB")
                continue
            try:
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError) as e:
                    raise ConfigError(f"{where}: not valid JSON ({getattr(e, 'msg', e)})") from e
                out.append((where, conversation(record, where)))
            except ConfigError as e:
                if not skip_bad_records:
                    raise ConfigError(
                        f"{e}; fix it, or set data.skip_bad_records=true to skip such records"
                    ) from e
                skipped.append(str(e))
    if skipped:
        print_line(
            f"warning: {path}: skipped {len(skipped)} bad chat records (the first: {skipped[0]})"
        )
    return out


def load_chat_template(tokenizer_path: str | None) -> str | None:
    """The chat template beside a tokenizer.json (its folder's `chat_template.jinja`, else the
    `chat_template` of `tokenizer_config.json`), or None."""
    if not tokenizer_path:
        return None
    folder = Path(tokenizer_path).expanduser().parent
    jinja = folder / CHAT_TEMPLATE_FILES[0]
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = folder / CHAT_TEMPLATE_FILES[1]
    if not config.is_file():
        return None
    template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


class ChatRenderer:
    """Conversations as (text, trained) pieces: with `template` (Jinja), through Hugging Face's
    `apply_chat_template`, which runs it in jinja2's immutable sandbox; without, by
    `DEFAULT_TEMPLATE`."""

    def __init__(self, template: str | None, tokenizer_path: str | None):
        self.template = template
        self._hf = None
        if template is not None:
            from transformers import PreTrainedTokenizerFast

            self._hf = PreTrainedTokenizerFast(tokenizer_file=str(Path(tokenizer_path or "")))
            self._hf.chat_template = template

    def pieces(self, messages: list[dict[str, str]], where: str) -> list[tuple[str, bool]]:
        """The conversation up to its last assistant turn as (text, trained) pieces."""
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        if self._hf is None:
            out = []
            for m in messages[: last + 1]:
                header = f"<|{m['role']}|>\n"
                if m["role"] == "assistant":
                    out += [(header, False), (f"{m['content']}<|end|>\n", True)]
                else:
                    out.append((DEFAULT_TEMPLATE.format(**m), False))
            return out
        out, done = [], ""
        for i in range(last + 1):
            if messages[i]["role"] != "assistant":
                continue
            # The text before the turn (with the assistant's header), then the text through it:
            # what lies between is the turn, whatever markup the template adds around it.
            before = self._render(messages[:i], generation_prompt=True)
            through = self._render(messages[: i + 1], generation_prompt=False)
            if not (before.startswith(done) and through.startswith(before)):
                raise ConfigError(
                    f"{where}: the tokenizer's chat template does not render a conversation's "
                    "start as the start of the whole, so the assistant's tokens cannot be "
                    "found; use a template that does, or remove it to use the default"
                )
            out += [(before[len(done) :], False), (through[len(before) :], True)]
            done = through
        return [(text, trained) for text, trained in out if text]

    def _render(self, messages: list[dict[str, str]], *, generation_prompt: bool) -> str:
        assert self._hf is not None
        text = self._hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
        return str(text)


def encode_conversation(pieces: list[tuple[str, bool]], tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(ids, loss mask) of a conversation's pieces, each tokenized on its own, and the
    tokenizer's end-of-text id after them (trained when the last piece is)."""
    ids = [np.asarray(tokenizer.encode(text), dtype=np.int64) for text, _ in pieces]
    mask = [
        np.full(len(i), trained, dtype=bool) for i, (_, trained) in zip(ids, pieces, strict=True)
    ]
    if tokenizer.eos_id is not None:
        ids.append(np.asarray([tokenizer.eos_id], dtype=np.int64))
        mask.append(np.asarray([pieces[-1][1]], dtype=bool))
    return np.concatenate(ids), np.concatenate(mask)


class ChatWindows(TokenWindows):
    """`TokenWindows` over chat tokens whose samples are dicts: "tokens", "loss_mask" (1 where
    the token is trained on as a target) and, packed, "documents".

    An index may come as (window, loss_scale) from `LossScaledSampler`: the sample then carries
    its optimizer step's `loss_scale` (see `lm/module.py` `CausalLM.loss_fn`)."""

    def __init__(
        self,
        tokens: np.ndarray,
        mask: np.ndarray,
        seq_len: int,
        *,
        split: str,
        separator: int | None,
    ):
        super().__init__(tokens, seq_len, split=split, separator=separator)
        self.mask = mask
        # Trained targets before each token: a window's count is two lookups.
        self._counts = np.concatenate([[0], np.cumsum(mask[1:], dtype=np.int64)])

    def __getitem__(self, i):  # type: ignore[override]
        index, scale = i if isinstance(i, tuple) else (i, None)
        sample = super().__getitem__(index)
        out = dict(sample) if isinstance(sample, dict) else {"tokens": sample}
        start = index * self.seq_len
        out["loss_mask"] = torch.from_numpy(self.mask[start : start + self.seq_len + 1].copy())
        if scale is not None:
            out["loss_scale"] = torch.tensor(scale, dtype=torch.float64)
        return out

    def trained_targets(self, window: int) -> int:
        """How many of the window's targets (its tokens after the first) are trained on."""
        start = window * self.seq_len
        return int(self._counts[start + self.seq_len] - self._counts[start])


class ChatSource:
    """A `format: chat` source: JSON Lines files of chat records (`DataSource.path`), read and
    checked when built, tokenized in memory (`prepare`), the last `val_fraction` of each split
    by conversation."""

    def __init__(
        self,
        spec: DataSource,
        *,
        name: str,
        where: str,
        tokenizer,
        tokenizer_path,
        seq_len: int,
        val_fraction: float,
        files: list[Path],
        skip_bad_records: bool = False,
    ):
        self.spec, self.name, self.where = spec, name, where
        self.tokenizer, self.seq_len, self.val_fraction = tokenizer, seq_len, val_fraction
        self.files = files
        template = load_chat_template(tokenizer_path)
        self.renderer = ChatRenderer(template, tokenizer_path)
        self.conversations = [
            c for f in files for c in read_conversations(f, skip_bad_records=skip_bad_records)
        ]
        if not self.conversations:
            raise ConfigError(f"{where}={spec.path!r} holds no chat record")
        self.inputs = {
            "files": len(files),
            "bytes": sum(file_sizes(files)),
            "conversations": len(self.conversations),
            "chat_template": "tokenizer" if template is not None else "default",
            "first_paths": [str(f) for f in files[:5]],
        }
        log.info(
            "Reading %d chat records from %d files (%s chat template)",
            len(self.conversations),
            len(files),
            self.inputs["chat_template"],
        )
        self.splits: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
        self.prepare()  # tokenized now: a bad template or a short split fails before step 1

    def prepare(self) -> None:
        """Render and tokenize every conversation (once)."""
        if self.splits is not None:
            return
        encoded = [
            encode_conversation(self.renderer.pieces(m, w), self.tokenizer)
            for w, m in self.conversations
        ]
        held_out = max(1, int(len(encoded) * self.val_fraction))
        if len(encoded) < 2:
            raise ConfigError(
                f"{self.where}: one chat record cannot make both a training and a "
                "validation split; add records"
            )
        parts = {"train": encoded[:-held_out], "val": encoded[-held_out:]}
        self.splits = {
            split: (np.concatenate([i for i, _ in p]), np.concatenate([m for _, m in p]))
            for split, p in parts.items()
        }
        for split, (ids, _) in self.splits.items():
            if len(ids) < self.seq_len + 1:
                raise ConfigError(
                    f"{self.where}: the {split} split has {len(ids)} tokens, too few for one "
                    f"window of data.seq_len={self.seq_len}; add records, lower data.seq_len"
                    + (" or raise data.val_fraction" if split == "val" else "")
                )

    @property
    def val_tokens(self) -> int:
        """The validation split's tokens (known once built: the mixture's pre-start check of
        the validation split reads it)."""
        assert self.splits is not None
        return len(self.splits["val"][0])

    def windows(self, split: str, separator: int | None) -> ChatWindows:
        """The split's windows, each with its loss mask."""
        self.prepare()
        assert self.splits is not None
        ids, mask = self.splits[split]
        return ChatWindows(ids, mask, self.seq_len, split=split, separator=separator)


class AllTrained(Dataset):
    """The windows of a source other than chat in a mixture with chat sources: each sample a
    dict with a `loss_mask` of ones (every target trained on), so it batches with chat's."""

    def __init__(self, windows: Any, seq_len: int):
        self.windows, self.seq_len = windows, seq_len

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i):
        index, scale = i if isinstance(i, tuple) else (i, None)
        sample = self.windows[index]
        out = dict(sample) if isinstance(sample, dict) else {"tokens": sample}
        out["loss_mask"] = torch.ones(len(out["tokens"]), dtype=torch.bool)
        if scale is not None:
            out["loss_scale"] = torch.tensor(scale, dtype=torch.float64)
        return out

    def trained_targets(self, window: int) -> int:
        return self.seq_len


class MixedChat(ConcatDataset):
    """Chat sources (`ChatWindows`) and others (`AllTrained`) end to end, taking the
    (window, loss_scale) indices of `LossScaledSampler` and counting trained targets."""

    def __init__(self, parts: list[Any], seq_len: int):
        super().__init__(parts)
        self.seq_len = seq_len

    def _locate(self, index: int) -> tuple[Any, int]:
        part = bisect.bisect_right(self.cumulative_sizes, index)
        start = self.cumulative_sizes[part - 1] if part else 0
        return self.datasets[part], index - start

    def __getitem__(self, i):
        index, scale = i if isinstance(i, tuple) else (i, None)
        part, local = self._locate(index)
        return part[local] if scale is None else part[(local, scale)]

    def trained_targets(self, window: int) -> int:
        part, local = self._locate(window)
        return part.trained_targets(local)


def with_loss_masks(sets: list[Any], seq_len: int) -> Any:
    """A split of a mixture with a chat source: the chat windows as they are, the others'
    `AllTrained`, laid end to end (one source: itself)."""
    parts = [s if isinstance(s, ChatWindows) else AllTrained(s, seq_len) for s in sets]
    return parts[0] if len(parts) == 1 else MixedChat(parts, seq_len)


class LossScaledSampler(MixtureSampler):
    """`MixtureSampler` whose indices are (window, loss_scale): the step's targets over its
    trained targets, counted over the whole global batch, the same on every rank. The module
    multiplies each micro-batch's summed loss over its targets' count by it, so the mean over
    micro-batches and ranks is the mean over the global batch's trained targets whatever the
    layout (`CausalLM.loss_fn`)."""

    def __init__(self, windows: ChatWindows | MixedChat, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.windows = windows

    def __iter__(self):  # type: ignore[override]
        first = self.epoch * self.steps_per_epoch
        for step in range(max(self.start_step, first), first + self.steps_per_epoch):
            batch = self.step_batch(step)
            trained = sum(self.windows.trained_targets(int(i)) for i in batch)
            # A step with no trained target has a zero loss whatever the scale.
            scale = batch.numel() * self.windows.seq_len / trained if trained else 0.0
            for micro_step in range(self.grad_accumulation):
                for index in self._slice(batch, 0, micro_step):
                    yield (index, scale)
