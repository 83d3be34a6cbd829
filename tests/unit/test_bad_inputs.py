"""Bad input and security: one table of mistakes, each one line `error: ...` with exit 2 before
step 1 (or one `warning:` line where noted); no code run from a config; no secret echoed.

The table runs in this process, through the same `train()` and `report_config_error` as
`train.py`'s main, with the Trainer replaced by a tripwire: a row that gets past the checks
trips it instead of training. Its "fsdp: " and "3d: " rows are the strategies' own checks; its
"W&B" rows run with no W&B login and a closed local port for a server. Also: the target
allowlist, CPU capacity, what counts as a secret, schemas that are not choices, data symlinks, W&B's offline fallback and the server and key W&B would use. (The
real `train.py` processes are tests/e2e/test_bad_inputs_e2e.py.)
"""

from __future__ import annotations

import gzip
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra.errors import CompactHydraException

from lightning_dist.config import compose_config
from lightning_dist.config.targets import check_hydra_overrides
from lightning_dist.lm.token_cache import find_files, resolve_files
from lightning_dist.run.errors import ConfigError, report_config_error

SECRET = "planted0override0secret0value0000"
ENV_SECRET = "planted0environment0secret0value0"


def fast(
    *extra: str,
    strategy: str = "single",
    data: str = "synthetic",
    logger: str = "none",
    model: str = "llama_debug",
) -> tuple[str, ...]:
    """A tiny run of the debug model; `extra` comes last."""
    return (
        f"model={model}",
        f"data={data}",
        f"strategy={strategy}",
        f"logger={logger}",
        "trainer.val_check_interval=null",
        *extra,
    )


def write(path: Path, text: str | bytes = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def big_tokenizer(tmp: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    words = {f"w{i}": i for i in range(599)} | {"[UNK]": 599}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp / "big_tokenizer.json"))


def short_text_tokenized_before(tmp: Path) -> None:
    """short.txt, 10 words of a word-level tokenizer (its ids known only once tokenized),
    tokenized into {tmp}/cache as an earlier run's prepare_data did."""
    from lightning_dist.lm.data import TextDataModule

    tokenizers = pytest.importorskip("tokenizers")
    words = {f"w{i}": i for i in range(99)} | {"[UNK]": 99}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp / "small_tokenizer.json"))
    write(tmp / "short.txt", " ".join(f"w{i}" for i in range(10)))
    TextDataModule(
        paths=[str(tmp / "short.txt")],
        tokenizer=str(tmp / "small_tokenizer.json"),
        seq_len=32,
        cache_dir=str(tmp / "cache"),
    ).prepare_data()


def empty_parquet(path: Path) -> None:
    """A Parquet file of a `text` column and no row."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)


def resumable_checkpoint(folder: Path, **model) -> Path:
    """A complete step1.ckpt of llama_debug with `model` changed, as a run's save writes it."""
    import dataclasses

    import torch

    from lightning_dist.checkpoint.format import finish_folder, gather_state, save_state
    from lightning_dist.models.args import ModelArgs

    debug = dict(
        dim=64,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=512,
        ffn_hidden_size=128,
        max_seq_len=256,
    )
    args = ModelArgs(**{**debug, **model})
    module = torch.nn.Module()
    module.model = args.build()
    optimizer = torch.optim.AdamW(module.parameters())
    path = folder / "step1.ckpt"
    path.mkdir(parents=True)
    save_state(gather_state(module, [optimizer]), path)
    finish_folder(path, {"global_step": 1}, {"step": 1, "model": dataclasses.asdict(args)})
    return path


@dataclass(frozen=True)
class Case:
    """One mistake. `{tmp}` and `{marker}` in the overrides name a scratch folder and a file
    that an attack would create."""

    name: str
    overrides: tuple[str, ...]
    expect: str
    """Part of the one line."""
    warning: bool = False
    """A single warning and the run goes on, instead of an error."""
    prepare: Callable[[Path], None] | None = None
    env: tuple[tuple[str, str | None], ...] = ()
    """Environment variables to set (None: unset); `{tmp}` and `{closed_port}` are filled in."""
    within: float | None = None
    """Seconds the in-process run may take to stop or warn."""


WANDB_OFFLINE_LOGIN = (
    ("WANDB_API_KEY", None), ("WANDB_IDENTITY_TOKEN_FILE", None), ("WANDB_MODE", None),
    ("NETRC", "{tmp}/netrc"), ("WANDB_CONFIG_DIR", "{tmp}/wandb_config"),
    ("WANDB_BASE_URL", "http://127.0.0.1:{closed_port}"),
)  # fmt: skip
"""No W&B login anywhere (no key in the environment, no netrc file, no settings file: wandb's
and ours read `NETRC` and `WANDB_CONFIG_DIR` before the home directory) and a W&B server that
is a closed local port."""
WANDB_KEY = (("WANDB_API_KEY", "fake" * 10),)
"""A W&B key of a valid form (40 characters) that no server will ever see."""


NO_AWS_CREDENTIALS = tuple(
    (name, None)
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    )
) + (
    ("AWS_SHARED_CREDENTIALS_FILE", "{tmp}/no_aws_credentials"),
    ("AWS_CONFIG_FILE", "{tmp}/no_aws_config"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
)
"""No AWS credentials in the environment, the files or an instance role (not asked)."""


ATTACK = "'touch {marker}'"
CHAT_OK = '{"prompt": "2+2?", "response": "4"}\n'
"""A good chat record, so the bad one after it is found at line 2."""
CASES = [
    # Code execution through `_target_`, in every group that builds something.
    Case("strategy target", fast(f"+strategy.command={ATTACK}", "strategy._target_=os.system"),
         "strategy._target_='os.system' is not allowed"),
    Case("callback target", fast("+callbacks.x._target_=os.system", f"+callbacks.x.command={ATTACK}"),
         "callbacks.x._target_='os.system' is not allowed"),
    Case("callback print", fast("+callbacks.x._target_=builtins.print"),
         "'builtins.print' is not allowed"),
    Case("callback through an allowed module", fast("+callbacks.x._target_=lightning_dist.callbacks.comm.torch.load"),
         "'lightning_dist.callbacks.comm.torch.load' is not allowed"),
    Case("logger target", fast("logger._target_=os.system", f"+logger.command={ATTACK}", logger="csv"),
         "logger._target_='os.system' is not allowed"),
    Case("model target", fast("model._target_=os.system"), "model._target_='os.system' is not allowed"),
    Case("data target", fast("data._target_=os.system"), "data._target_='os.system' is not allowed"),
    Case("optimizer target", fast("+optim._target_=os.system", f"+optim.command={ATTACK}"),
         "optim._target_ is set, but nothing is built from optim"),
    Case("hydra callback", fast("+hydra.callbacks.x._target_=os.system", f"+hydra.callbacks.x.command={ATTACK}"),
         "hydra.callbacks.x._target_ is refused"),
    Case("slurm launcher shell line", fast("hydra/launcher=submitit_slurm", f"hydra.launcher.setup=[{ATTACK}]"),
         "hydra.launcher.setup is refused"),
    # Secrets in overrides are never echoed.
    Case("unknown secret key", fast(f"+api_token={SECRET}"), "unknown config key api_token"),
    Case("secret key without +", fast(f"api_token={SECRET}"), "Key 'api_token' not in 'TrainSchema'"),
    # Tracebacks before.
    Case("negative max_steps", fast("trainer.max_steps=-5"), "trainer.max_steps=-5 must be at least 1"),
    Case("negative lr", fast("optim.lr=-1"), "optim.lr=-1.0 must be 0 or more"),
    Case("negative gc interval", fast("trainer.gc_every_n_steps=-1"),
         "trainer.gc_every_n_steps=-1 must be 0 (Python's own collection) or more"),
    Case("negative memory step", fast("trainer.memory_by_category_step=-1"),
         "trainer.memory_by_category_step=-1 must be 0 (not measured) or more"),
    Case("empty data file", fast("data.paths=[{tmp}/empty.txt]", "data.seq_len=32", data="text"),
         "holds no text", prepare=lambda tmp: write(tmp / "empty.txt")),
    Case("unreadable data file", fast("data.paths=[{tmp}/locked.txt]", "data.seq_len=32", data="text"),
         "cannot read", prepare=lambda tmp: write(tmp / "locked.txt", "x" * 500).chmod(0)),
    Case("data too short", fast("data.paths=[{tmp}/short.txt]", "data.seq_len=32", data="text"),
         "the train split has 10 tokens", prepare=lambda tmp: write(tmp / "short.txt", "x" * 10)),
    Case("validation split under one micro-batch",
         fast("data.paths=[{tmp}/small.txt]", "data.seq_len=32", "trainer.val_check_interval=5", data="text"),
         "the validation split has 3 windows of data.seq_len=32, fewer than one micro-batch for each of 1 data-parallel ranks (1 x 16 = 16); raise data.val_fraction or add text, lower data.per_rank_batch_size, or turn validation off with trainer.val_check_interval=null",
         prepare=lambda tmp: write(tmp / "small.txt", "word " * 1000)),
    Case("validation samples under one micro-batch", fast("data.val_samples=4", "trainer.val_check_interval=5"),
         "the validation split has 4 windows of data.seq_len=128, fewer than one micro-batch for each of 1 data-parallel ranks (1 x 8 = 8); raise data.val_samples"),
    Case("binary garbage in a data file", fast("data.paths=[{tmp}/mixed]", "data.seq_len=32", data="text"),
         "mixed/b.txt is not text (it holds NUL bytes at offset 600)",
         prepare=lambda tmp: (write(tmp / "mixed/a.txt", "text " * 200),
                              write(tmp / "mixed/b.txt", b"y" * 600 + bytes(range(256))))),
    Case("data mostly not UTF-8", fast("data.paths=[{tmp}/latin]", "data.seq_len=32", data="text"),
         "not text: 65% of its 1776 bytes are not valid UTF-8 (at most 30%); the worst file is",
         prepare=lambda tmp: (write(tmp / "latin/a.txt", "a" * 600),
                              write(tmp / "latin/b.txt", bytes(range(0xC0, 0x100)) * 18 + b"b" * 24))),
    Case("data path is a named pipe", fast("data.paths=[{tmp}/pipe.txt]", data="text"),
         "pipe.txt' is a named pipe (FIFO), not a regular file", prepare=lambda tmp: os.mkfifo(tmp / "pipe.txt")),
    Case("small gzip as data", fast("data.paths=[{tmp}/small.txt.gz]", data="text"),
         "small.txt.gz decompresses to data that is not text (a NUL byte at offset 0)",
         prepare=lambda tmp: write(tmp / "small.txt.gz", gzip.compress(bytes(range(256)) * 8))),
    Case("checkpoint folder below a file", fast("trainer.checkpoint.dirpath={tmp}/notes.txt/ckpts"),
         "(trainer.checkpoint.dirpath) is below a file, ", prepare=lambda tmp: write(tmp / "notes.txt", "x")),
    Case("checkpoint folder is a file", fast("trainer.checkpoint.dirpath={tmp}/notes.txt"),
         "notes.txt (trainer.checkpoint.dirpath) is a file; set trainer.checkpoint.dirpath to a folder",
         prepare=lambda tmp: write(tmp / "notes.txt", "x")),
    # Silently wrong before.
    Case("resume a checkpoint of other heads", fast("trainer.resume=auto", "trainer.checkpoint.dirpath={tmp}/ckpts"),
         "step1.ckpt was written for model.n_heads=8, the configured model has 4; resume it with its own model (model=llama_debug model.dim=64",
         prepare=lambda tmp: resumable_checkpoint(tmp / "ckpts", n_heads=8, n_kv_heads=4)),
    Case("ckpt_path of another norm epsilon", fast("trainer.ckpt_path={tmp}/ckpts/step1.ckpt"),
         "was written for model.norm_eps=0.001, the configured model has 1e-05",
         prepare=lambda tmp: resumable_checkpoint(tmp / "ckpts", norm_eps=1e-3)),
    # A run's home (issue 30): a fresh start never writes over an earlier run's records.
    Case("fresh start over an earlier run", fast(), "would write over an earlier run (",
         prepare=lambda tmp: write(tmp / "run" / "metrics" / "metrics.csv", "step\n0\n")),
    Case("run name that leaves its folder", fast("run_name=../elsewhere"), "run_name='../elsewhere' must be one folder name"),
    Case("keep no checkpoint", fast("trainer.checkpoint.keep_last=0"), "trainer.checkpoint.keep_last=0 must be 1 or more"),
    Case("fp16 on CPU", fast("trainer.precision=16-mixed"),
         "trainer.precision=16-mixed: CPUs have no fp16 autocast; set trainer.precision=bf16-mixed"),
    Case("unknown top-level key", fast("+foo=1"), "unknown config key foo"),
    Case("a knob of other strategies", fast("strategy.shard_optimizer=true", strategy="fsdp"),
         "Key 'shard_optimizer' not in 'FSDPSchema'; strategy.shard_optimizer is a setting of ddp, fsdp2, 3d: choose one of those strategies"),
    Case("zero lr", fast("optim.lr=0"), "optim.lr=0: the weights will not change", warning=True),
    Case("more CPU processes than cores", fast("hardware.devices=100", strategy="ddp"),
         "hardware.devices=100 starts 100 CPU processes, but this machine has"),
    Case("internal schema", fast(strategy="schema_ddp"), "Could not find 'strategy/schema_ddp'"),
    # One line already, kept so.
    Case("misspelt key", fast("model.dimm=3"), "Key 'dimm' not in"),
    Case("hardware mismatch", fast("hardware=dgx_h100", strategy="ddp"),
         "needs 8 CUDA devices per node; this machine has 0"),
    Case("global batch", fast("hardware.devices=2", "data.global_batch_size=6", "data.per_rank_batch_size=2", strategy="ddp"),
         "global_batch_size=6"),
    Case("glob matches nothing", fast("data.paths=[nowhere/*.txt]", data="text"), "nowhere/*.txt"),
    Case("tokenizer too big", fast("data.tokenizer={tmp}/big_tokenizer.json", data="text"), "600",
         prepare=big_tokenizer),
    Case("tokenizer file that is not one", fast("data.tokenizer={tmp}/notes.txt", data="text"),
         "data.tokenizer: '{tmp}/notes.txt' is not a tokenizer.json that `tokenizers` can load",
         prepare=lambda tmp: write(tmp / "notes.txt", "some notes")),
    # Mixtures of sources (data=mixture, data.sources): weights, files, token ids.
    Case("source weight 0", fast("data.sources=[{{path: {tmp}/a.txt, weight: 0}}]", data="mixture"),
         "data.sources[0].weight=0.0 must be a finite number above 0", prepare=lambda tmp: write(tmp / "a.txt", "a" * 900)),
    Case("source weight negative", fast("data.sources=[{{path: {tmp}/a.txt}}, {{path: {tmp}/a.txt, name: b, weight: -0.5}}]", data="mixture"),
         "data.sources[1].weight=-0.5 must be a finite number above 0", prepare=lambda tmp: write(tmp / "a.txt", "a" * 900)),
    Case("source weight NaN", fast("data.sources=[{{path: {tmp}/a.txt, weight: nan}}]", data="mixture"),
         "data.sources[0].weight=nan must be a finite number above 0", prepare=lambda tmp: write(tmp / "a.txt", "a" * 900)),
    Case("source matches no file", fast("data.sources=[{{path: '{tmp}/none/*.txt'}}]", data="mixture"),
         "data.sources[0].path: '{tmp}/none/*.txt' matches no file"),
    Case("token source matches no file", fast("data.sources=[{{path: '{tmp}/*.bin', format: tokens}}]", data="mixture"),
         "data.sources[0].path='{tmp}/*.bin' matches no file"),
    Case("token id above the vocabulary", fast("data.sources=[{{path: {tmp}/ids.bin, format: tokens}}]", "data.seq_len=16", data="mixture"),
         "ids.bin holds token id 600 (first at position 700), at or above the model's vocab_size=512",
         prepare=lambda tmp: write(tmp / "ids.bin", bytes(1400) + (600).to_bytes(2, "little") + bytes(100))),
    Case("truncated token file", fast("data.sources=[{{path: {tmp}/ids.bin, format: tokens}}]", data="mixture"),
         "ids.bin has 2001 bytes, not a whole number of uint16 ids: a truncated file",
         prepare=lambda tmp: write(tmp / "ids.bin", bytes(2001))),
    Case("corrupt Megatron index", fast("data.sources=[{{path: {tmp}/mega, format: megatron}}]", data="mixture"),
         "mega.idx is not a Megatron indexed-dataset index",
         prepare=lambda tmp: (write(tmp / "mega.idx", b"MMIDXXXX" + bytes(40)), write(tmp / "mega.bin", bytes(8)))),
    Case("malformed JSON line in a source", fast("data.sources=[{{path: {tmp}/docs.jsonl, format: jsonl}}]", data="mixture"),
         "docs.jsonl:3: not valid JSON", prepare=lambda tmp: write(tmp / "docs.jsonl", '{"text": "a"}\n{"text": "b"}\n{"text": \n')),
    Case("missing field in a source", fast("data.sources=[{{path: {tmp}/docs.jsonl, format: jsonl, field: body}}]", data="mixture"),
         "body", prepare=lambda tmp: write(tmp / "docs.jsonl", '{"text": "a"}\n')),
    Case("empty Parquet source", fast("data.sources=[{{path: {tmp}/empty.parquet, format: parquet}}]", data="mixture"),
         "data.sources[0].path (1 files, 0 records) holds no text in field 'text'", prepare=lambda tmp: empty_parquet(tmp / "empty.parquet")),
    Case("records too short for a window", fast("data.sources=[{{path: {tmp}/docs.jsonl, format: jsonl}}]", "data.seq_len=32", data="mixture"),
         "the train split has 20 tokens, too few for one window of data.seq_len=32", prepare=lambda tmp: write(tmp / "docs.jsonl", '{"text": "abcdef"}\n' * 3)),
    Case("text too short for a window, tokenized before", fast("data.paths=[{tmp}/short.txt]", "data.tokenizer={tmp}/small_tokenizer.json", "data.cache_dir={tmp}/cache", "data.seq_len=32", data="text"),
         "data.paths: the train split has 9 tokens, too few for one window of data.seq_len=32", prepare=short_text_tokenized_before),
    Case("empty file of a source", fast("data.sources=[{{path: {tmp}/docs.jsonl, format: jsonl}}]", data="mixture"),
         "holds no text; add non-empty files to data.sources[0].path", prepare=lambda tmp: write(tmp / "docs.jsonl")),
    # Chat records of supervised fine-tuning (format: chat, lm/chat.py), named by file:line.
    Case("chat record with no assistant turn", fast("data.sources=[{{path: {tmp}/chat.jsonl, format: chat}}]", data="mixture"),
         "chat.jsonl:2: no assistant turn", prepare=lambda tmp: write(tmp / "chat.jsonl", CHAT_OK + '{"messages": [{"role": "user", "content": "hi"}]}\n')),
    Case("chat message of an unknown role", fast("data.sources=[{{path: {tmp}/chat.jsonl, format: chat}}]", data="mixture"),
         "chat.jsonl:2: message 0 has role 'robot', not one of system, user, assistant, tool", prepare=lambda tmp: write(tmp / "chat.jsonl", CHAT_OK + '{"messages": [{"role": "robot", "content": "hi"}]}\n')),
    Case("chat messages not a list", fast("data.sources=[{{path: {tmp}/chat.jsonl, format: chat}}]", data="mixture"),
         "chat.jsonl:2: 'messages' is str, not a non-empty list", prepare=lambda tmp: write(tmp / "chat.jsonl", CHAT_OK + '{"messages": "hi"}\n')),
    Case("chat record without its fields", fast("data.sources=[{{path: {tmp}/chat.jsonl, format: chat}}]", data="mixture"),
         "chat.jsonl:2: no field 'messages' nor 'prompt'/'response'", prepare=lambda tmp: write(tmp / "chat.jsonl", CHAT_OK + '{"text": "hi"}\n')),
    Case("chat source mixed with a streamed one", fast("data.sources=[{{path: {tmp}/chat.jsonl, format: chat}}, {{path: {tmp}/a.txt, stream: true}}]", data="mixture"),
         "data.sources[0] (format=chat) is mixed with data.sources[1], which is streamed", prepare=lambda tmp: write(tmp / "chat.jsonl", CHAT_OK)),
    # Remote sources (data/remote.py): no credentials anywhere, a protocol fsspec lacks, no match.
    Case("remote URL without credentials", fast("data.sources=[{{path: 's3://corpus/docs/*.jsonl', format: jsonl}}]", data="mixture"),
         "data.sources[0].path='s3://corpus/docs/*.jsonl' needs AWS credentials and none were found", env=NO_AWS_CREDENTIALS),
    Case("remote URL of an unknown protocol", fast("data.sources=[{{path: 'nosuch://corpus/a.jsonl', format: jsonl}}]", data="mixture"),
         "data.sources[0].path='nosuch://corpus/a.jsonl': protocol 'nosuch' is not one fsspec can read"),
    Case("remote URL matches nothing", fast("data.sources=[{{path: 'memory://corpus/none/*.jsonl', format: jsonl}}]", data="mixture"),
         "data.sources[0].path='memory://corpus/none/*.jsonl' matches no remote file"),
    Case("seq_len too long", fast("data.seq_len=4096"), "data.seq_len=4096"),
    Case("many nodes without launcher", fast("hardware.num_nodes=2", strategy="ddp"), "torchrun"),
    # The strategies' own checks (moved from tests/dist: they need no process to fail).
    Case('fsdp: unknown sharding strategy', fast('strategy.sharding_strategy=ZERO3', strategy='fsdp'),
         'FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, _HYBRID_SHARD_ZERO2, NO_SHARD'),
    Case('fsdp: hybrid shard size', fast('strategy.sharding_strategy=HYBRID_SHARD', 'strategy.hybrid_shard_size=3', 'hardware.devices=4', strategy='fsdp'),
         'hybrid_shard_size=3 does not divide the world size 4'),
    Case('fsdp: auto-wrap class absent', fast('strategy.auto_wrap=[LlamaDecoderLayer]', strategy='fsdp'),
         'block classes are: TransformerBlock'),
    Case('fsdp: cpu offload on cpu', fast('strategy.cpu_offload=true', strategy='fsdp'),
         'cpu_offload=true'),
    Case('fsdp: fsdp2 replicas', fast('strategy.dp_replicate=3', 'hardware.devices=4', strategy='fsdp2'),
         'dp_replicate=3 does not divide the world size 4'),
    # ZeRO-1 (strategy.shard_optimizer): only over replicas that hold whole parameters.
    Case('zero1: one replica', fast('strategy.shard_optimizer=true', 'hardware.devices=2', 'strategy.tp=2', strategy='3d'),
         'strategy.shard_optimizer=true shards the optimizer states over the data-parallel replicas, and dp_replicate=1 has none to shard over'),
    Case('zero1: under fsdp', fast('strategy.shard_optimizer=true', 'hardware.devices=2', strategy='fsdp2'),
         'strategy.shard_optimizer=true with dp_shard x cp = 2: FSDP shards the optimizer states already'),
    Case('zero1: with diloco', fast('strategy.shard_optimizer=true', 'strategy.diloco_inner_steps=4', 'hardware.devices=2', strategy='ddp'),
         'strategy.shard_optimizer=true with strategy.diloco_inner_steps=4 is not supported'),
    Case('zero1: with grad compression', fast('strategy.shard_optimizer=true', 'strategy.grad_compression=bf16', 'hardware.devices=2', strategy='ddp'),
         'strategy.shard_optimizer=true with strategy.grad_compression=bf16 is not supported'),
    Case('zero1: with a simulated delay', fast('strategy.shard_optimizer=true', 'strategy.simulate_delay_ms=50', 'hardware.devices=2', strategy='ddp'),
         'strategy.shard_optimizer=true with strategy.simulate_delay_ms=50 is not supported'),
    Case('3d: degrees', fast('strategy.tp=2', 'strategy.pp=2', 'strategy.dp_shard=1', 'hardware.devices=2', strategy='3d'),
         'multiply to 4, but the world size is 2'),
    Case('3d: heads', fast('hardware.devices=8', strategy='tp'),
         'n_heads=4 is not divisible by tp=8'),
    Case('3d: kv heads', fast('hardware.devices=2', 'model.n_kv_heads=1', strategy='tp'),
         'n_kv_heads=1 is not divisible by tp=2'),
    Case('3d: ffn', fast('hardware.devices=2', 'model.ffn_hidden_size=129', strategy='tp'),
         'ffn_hidden_size=129 is not divisible by tp=2'),
    Case('3d: vocab', fast('hardware.devices=2', 'model.vocab_size=513', strategy='tp'),
         'vocab_size=513 is not divisible by tp=2'),
    Case('3d: layers', fast('hardware.devices=2', 'model.n_layers=3', 'strategy.schedule=Interleaved1F1B', 'strategy.virtual_stages=2', strategy='pp'),
         'n_layers=3 is fewer than pp=2 x virtual_stages=2 = 4'),
    Case('3d: microbatches', fast('hardware.devices=4', 'strategy.microbatches=2', strategy='pp'),
         '1F1B needs at least pp=4 microbatches, got 2'),
    Case('3d: batch', fast('strategy.pp=2', 'hardware.devices=4', 'data.global_batch_size=12', strategy='3d'),
         'global_batch_size=12 is not divisible by dp=2 x microbatches=4'),
    Case('3d: no protocol', fast('hardware.devices=2', 'model._target_=tests.plain_model.PlainArgs', strategy='pp'),
         'does not expose its layers for pipeline parallelism'),
    Case('3d: plan', fast('hardware.devices=2', 'strategy.tp_plan={{layers.0.attn.wq:colwise}}', strategy='tp'),
         "TP plan pattern 'layers.0.attn.wq' matches no module"),
    Case('cp: sequence', fast('strategy.cp=2', 'hardware.devices=2', 'data.seq_len=126', strategy='3d'),
         'data.seq_len=126 does not split into 2 x strategy.cp = 4 equal chunks; the nearest valid values are data.seq_len=124 and data.seq_len=128'),
    Case('cp: ulysses heads', fast('strategy.cp=4', 'strategy.cp_mode=ulysses', 'hardware.devices=4', 'model.dim=96', 'model.n_heads=6', 'model.n_kv_heads=2', strategy='3d'),
         'strategy.cp_mode=ulysses splits attention heads over strategy.cp=4 ranks: the 6 query heads must divide by it, and the 2 key/value heads divide by it or divide it; use strategy.cp_mode=allgather or another cp'),
    Case('cp: ulysses heads per tp rank', fast('strategy.cp=4', 'strategy.tp=2', 'strategy.cp_mode=ulysses', 'hardware.devices=8', strategy='3d'),
         'strategy.cp_mode=ulysses splits attention heads over strategy.cp=4 ranks: the 2 query heads per tp=2 rank must divide by it'),
    Case('cp: mode', fast('strategy.cp=2', 'strategy.cp_mode=ring', 'hardware.devices=2', strategy='3d'),
         "strategy.cp_mode='ring' is not one of allgather, ulysses"),
    Case('cp: hf sliding window', fast('model=hf_llama', 'model.config.model_type=mistral', 'strategy.cp=2', 'hardware.devices=2', strategy='3d'),
         'strategy.cp=2 runs causal attention without dropout, window or soft cap; MistralForCausalLM has sliding_window=4096: turn it off in model.config (null, or 0 for dropout) or use strategy.cp=1'),
    Case('cp: hf attention dropout', fast('model=hf_llama', '+model.config.attention_dropout=0.1', 'strategy.cp=2', 'hardware.devices=2', strategy='3d'),
         'LlamaForCausalLM has attention_dropout=0.1'),
    Case('cp: hf dynamic rope', fast('model=hf_llama', '+model.config.rope_scaling={{rope_type: dynamic, factor: 2.0}}', 'strategy.cp=2', 'hardware.devices=2', strategy='3d'),
         'LlamaForCausalLM uses rope_type=dynamic, whose frequencies follow the longest position a rank holds'),
    Case('packed documents: hf model', fast('model=hf_llama', 'data.pack_documents=true'),
         'data.pack_documents=true needs a model that keeps attention inside each document'),
    Case('packed documents: no end-of-text token',
         fast('data.tokenizer={tmp}/big_tokenizer.json', 'data.pack_documents=true', data='text'),
         'data.pack_documents=true needs an end-of-text token between documents',
         prepare=big_tokenizer),
    Case('float8: all-gather with rowwise', fast('strategy.float8=rowwise', 'strategy.float8_all_gather=true', strategy='fsdp2'),
         'strategy.float8_all_gather=true needs strategy.float8=tensorwise (torchao gathers float8 weights only with one scale per tensor)'),
    Case('float8: recipe', fast('strategy.float8=fp4'),
         "strategy.float8='fp4' is not one of none, tensorwise, rowwise"),
    Case('float8: no layer it can convert', fast('strategy.float8=tensorwise', 'model.dim=72'),
         'strategy.float8=tensorwise converts no linear layer of Transformer: a float8 matmul needs both sizes of a layer to be multiples of 16, and each of its 28 candidate layers has one that is not (e.g. layers.0.attention.wq is 72 x 72)'),
    Case('float8: no layer it can convert, plan.only', fast('strategy.float8=tensorwise', 'model.dim=72', 'plan.only=true'),
         'strategy.float8=tensorwise converts no linear layer of Transformer'),
    Case('float8: some layers it cannot convert', fast('strategy.float8=tensorwise', 'model.ffn_hidden_size=136'),
         'strategy.float8=tensorwise converts 16 of 28 candidate linear layers; 12 stay in high precision because a size is not a multiple of 16 (e.g. layers.0.feed_forward.w1 is 64 x 136)', warning=True),
    Case('float8: with tp', fast('hardware.devices=2', 'strategy.float8=rowwise', strategy='tp'),
         'strategy.float8=rowwise with tp=2 is not supported yet (tensorwise is); set strategy.float8=tensorwise or none, or tp=1'),
    # Mixture of experts (model=moe_debug): its options, and the layout it cannot run yet.
    Case('moe: top_k above the experts', fast('model.top_k=5', model='moe_debug'),
         'model.top_k=5 must be from 1 to model.num_experts=4 (each token\'s experts are distinct); set model.top_k<=4'),
    Case('moe: score function', fast('model.score_func=relu', model='moe_debug'),
         "model.score_func='relu' is not one of softmax, sigmoid"),
    Case('moe: no MoE layer left', fast('model.first_k_dense=4', model='moe_debug'),
         'model.first_k_dense=4 must be from 0 to model.n_layers - 1 = 3, so that at least one layer is an MoE layer'),
    Case('moe: negative bias rate', fast('model.bias_update_rate=-0.001', model='moe_debug'),
         'model.bias_update_rate=-0.001 must be 0 (off) or more'),
    Case('moe: resume a dense checkpoint', fast('trainer.resume=auto', 'trainer.checkpoint.dirpath={tmp}/ckpts', model='moe_debug'),
         'step1.ckpt was written for model.num_experts=none (dense), the configured model has 4',
         prepare=lambda tmp: resumable_checkpoint(tmp / "ckpts")),
    Case('moe: ft_hsdp', fast('hardware.devices=2', model='moe_debug', strategy='ft_hsdp'),
         'strategy=ft_hsdp with a mixture of experts (model.num_experts=4) is not supported yet; use strategy=fsdp2 or ddp',
         env=(("REPLICA_GROUP_ID", "0"), ("TORCHFT_LIGHTHOUSE", "http://127.0.0.1:{closed_port}"))),
    Case('moe: dry run in fp32', fast('plan.dry_run=true', model='moe_debug', strategy='fsdp2'),
         'plan.dry_run of a mixture of experts (model.num_experts=4) runs under trainer.precision=bf16-mixed only, not 32-true'),
    Case('dry run of ddp', fast('plan.dry_run=true', 'hardware=dgx_h100', strategy='ddp'),
         'plan.dry_run builds the mesh strategies (3d, fsdp2, tp, pp, auto), not strategy=ddp'),
    Case('moe: context parallelism', fast('hardware.devices=2', 'strategy.cp=2', model='moe_debug', strategy='3d'),
         'strategy.cp=2 with a mixture of experts (model.num_experts=4) is not supported yet; use strategy.cp=1'),
    # Expert parallelism (strategy.ep): it splits the experts and borrows dp_shard x cp's ranks.
    Case('moe: ep not dividing the experts', fast('hardware.devices=4', 'strategy.ep=4', 'model.num_experts=6', model='moe_debug', strategy='3d'),
         'strategy.ep=4 does not divide model.num_experts=6: each expert-parallel rank holds num_experts / ep experts; pick an ep that divides 6'),
    Case('moe: ep not dividing the ranks', fast('hardware.devices=2', 'strategy.ep=4', model='moe_debug', strategy='3d'),
         'strategy.ep=4 does not divide dp_shard x cp = 2 x 1 = 2, the ranks it borrows; pick an ep that divides 2'),
    Case('moe: ep on a dense model', fast('hardware.devices=2', 'strategy.ep=2', strategy='3d'),
         'strategy.ep=2 splits the experts of a mixture of experts, but the model is dense (no model.num_experts); use strategy.ep=1'),
    Case('moe: expert width under ep', fast('hardware.devices=4', 'strategy.ep=2', 'model.expert_hidden_size=63', model='moe_debug', strategy='3d'),
         'model.expert_hidden_size=63 is not divisible by dp_shard x cp / ep = 4 / 2 = 2, the ranks FSDP splits each expert\'s weights over'),
    Case('moe: ep on a Hugging Face mixture of experts', fast('model=hf_llama', 'model.config.model_type=mixtral', '+model.config.num_local_experts=4', '+model.config.num_experts_per_tok=2', 'hardware.devices=2', 'strategy.ep=2', strategy='3d'),
         'strategy.ep=2 splits the experts of our MoE layers (models/moe.py), and HFCausalLM has none; import it into our MoE model, which ep splits (python -m lightning_dist.checkpoint import DIR'),
    Case('moe: ep on a Hugging Face MoE the import refuses', fast('model=hf_llama', 'model.config.model_type=qwen2_moe', '+model.config.num_experts=4', '+model.config.moe_intermediate_size=64', '+model.config.shared_expert_intermediate_size=64', 'hardware.devices=2', 'strategy.ep=2', strategy='3d'),
         'HFCausalLM has none; model_type=qwen2_moe cannot be imported into our MoE model (ours has no q/k/v biases'),
    Case('moe: tp on a Hugging Face mixture of experts', fast('model=hf_llama', 'model.config.model_type=mixtral', '+model.config.num_local_experts=4', '+model.config.num_experts_per_tok=2', 'hardware.devices=2', 'strategy.tp=2', strategy='3d'),
         'strategy.tp=2 with a Hugging Face mixture of experts (HFCausalLM, 4 experts) is not supported: use dp_replicate and dp_shard'),
    # Elastic jobs (hardware.min_nodes): every node count in the range must hold the layout.
    Case('elastic: min above max', fast('hardware.min_nodes=3', 'hardware.num_nodes=2', strategy='ddp'),
         'hardware.min_nodes=3 must be between 1 and hardware.num_nodes=2'),
    Case('elastic: a round too small for the layout', fast('hardware.devices=2', 'hardware.num_nodes=2', 'hardware.min_nodes=1', 'strategy.tp=2', 'strategy.pp=2', strategy='3d'),
         'an elastic round on 1 of hardware.min_nodes=1 to hardware.num_nodes=2 nodes fails: world size 2'),
    # Live healing (strategy=ft_hsdp): started by its launcher, no gradient accumulation.
    Case('ft_hsdp: not started by the launcher', fast('hardware.devices=2', strategy='ft_hsdp'),
         'strategy=ft_hsdp needs REPLICA_GROUP_ID and TORCHFT_LIGHTHOUSE in the environment: start the run with `python -m lightning_dist.launch replicas'),
    # W&B (logger=wandb): asked to log online, it has a key and a server, or the run stops.
    Case("W&B online without a key", fast("logger.mode=online", logger="wandb"),
         "logger.mode=online, but W&B has no API key for http://127.0.0.1:", env=WANDB_OFFLINE_LOGIN,
         within=10),
    Case("W&B online by WANDB_MODE without a key", fast(logger="wandb"),
         "WANDB_MODE=online, but W&B has no API key", env=(*WANDB_OFFLINE_LOGIN, ("WANDB_MODE", "online"))),
    Case("W&B online with a closed server", fast(logger="wandb"),
         "WANDB_MODE=online, but the W&B server does not answer (127.0.0.1:",
         env=(*WANDB_OFFLINE_LOGIN, *WANDB_KEY, ("WANDB_MODE", "online")), within=10),
    Case("W&B mode misspelt", fast("logger.mode=onlin", logger="wandb"),
         "logger.mode=onlin is not a W&B mode: use online, offline or disabled"),
    Case("W&B refuses its server address", fast(logger="wandb"), "wandb refuses its settings (base_url:",
         env=(*WANDB_OFFLINE_LOGIN, ("WANDB_BASE_URL", "https://wandb.ai"), ("WANDB_MODE", "online"))),
    Case("W&B without a key, default mode", fast(logger="wandb"),
         "W&B has no API key for http://127.0.0.1:", warning=True, env=WANDB_OFFLINE_LOGIN, within=10),
    Case("logger key misspelt", fast("+logger.grup=x", logger="wandb"),
         "unknown config key logger.grup: lightning_dist.run.loggers.wandb_logger takes project"),
    Case("callback key misspelt", fast("+callbacks.progress.every=1"),
         "unknown config key callbacks.progress.every"),
    Case('ft_hsdp: no Lighthouse at the address', fast('hardware.devices=2', strategy='ft_hsdp'),
         'strategy=ft_hsdp: no torchft Lighthouse answers at http://127.0.0.1:',
         env=(("REPLICA_GROUP_ID", "0"), ("TORCHFT_LIGHTHOUSE", "http://127.0.0.1:{closed_port}")), within=10),
    Case('ft_hsdp: gradient accumulation', fast('hardware.devices=2', 'data.global_batch_size=16', 'data.per_rank_batch_size=2', strategy='ft_hsdp'),
         'strategy=ft_hsdp takes no gradient accumulation: data.global_batch_size=16 over 4 data-parallel ranks (2 groups x 2) needs 2 micro-batches of 2; set data.per_rank_batch_size=4'),
]  # fmt: skip


class _Tripwire(Exception):
    """Raised where the Trainer would be built: every check has passed."""


def _overrides(case: Case, tmp: Path) -> list[str]:
    marker = tmp / "marker"
    return [o.format(tmp=tmp, marker=marker) for o in case.overrides]


def _environment(env: tuple[tuple[str, str | None], ...], tmp: Path) -> dict[str, str | None]:
    """A case's `env`, filled in; None: unset the variable."""
    port = _closed_port()
    return {k: v if v is None else v.format(tmp=tmp, closed_port=port) for k, v in env}


def _set_environment(monkeypatch, env: tuple[tuple[str, str | None], ...], tmp: Path) -> None:
    for name, value in _environment(env, tmp).items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


def run_in_process(
    overrides: list[str], run_dir: Path, monkeypatch, capsys
) -> tuple[int, list[str]]:
    """What train.py's main does with these overrides: (exit status, stderr lines); status 0
    means every check passed and the Trainer would have been built."""
    from lightning_dist import train as train_module
    from lightning_dist.run import build as build_stage

    def tripwire(*args, **kwargs):
        raise _Tripwire

    monkeypatch.setattr(build_stage, "build_trainer", tripwire)
    capsys.readouterr()
    status = 0
    try:
        check_hydra_overrides(overrides)
        train_module.train(compose_config([*overrides, f"paths.output_dir={run_dir}"]))
    except _Tripwire:
        pass
    except (ConfigError, ValueError, CompactHydraException) as e:
        with pytest.raises(SystemExit) as exit_:
            report_config_error(e)
        status = exit_.value.code
    return status, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case, tmp_path, monkeypatch, capsys):
    if case.prepare:
        case.prepare(tmp_path)
    if case.name == "unreadable data file" and os.geteuid() == 0:
        # root reads a mode-000 file; make the open fail the way it does for everyone else
        locked, real_open = str(tmp_path / "locked.txt"), os.open

        def refuse(path, *args, **kwargs):
            if str(path) == locked:
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", refuse)
    _set_environment(monkeypatch, case.env, tmp_path)
    started = time.monotonic()
    status, lines = run_in_process(
        _overrides(case, tmp_path), tmp_path / "run", monkeypatch, capsys
    )
    if case.within is not None:
        assert time.monotonic() - started < case.within
    if case.warning:
        assert status == 0, lines
        assert len(lines) == 1 and lines[0].startswith("warning:"), lines
    else:
        assert status == 2, lines
        assert len(lines) == 1 and lines[0].startswith("error:"), lines
    assert case.expect.format(tmp=tmp_path) in lines[0], lines
    assert SECRET not in lines[0]
    assert not (tmp_path / "marker").exists()
    assert not (tmp_path / "run" / "summary.json").exists()


PLANNER_CASES = [
    fast("hardware.devices=4", "strategy.pp=2", "strategy.split_points=[9]", strategy="3d"),
    fast("hardware.devices=4", "strategy.cp=3", strategy="3d"),
    fast("hardware.devices=4", "strategy.ep=8", strategy="3d", model="moe_debug"),
    fast("hardware.devices=4", "strategy.cp=2", "data.seq_len=126", strategy="3d"),
    fast("data.global_batch_size=-8"),
]
"""Strategy settings that the planner CLI once planned around without a word, and a batch it
once refused in its own words (`global_batch_size=-8 must be positive`)."""


def test_the_planner_cli_refuses_what_plan_only_refuses(tmp_path, monkeypatch, capsys):
    """`python -m lightning_dist.plan` runs train.py's strategy checks (one function,
    `run.strategy_checks.check_built_strategy`): the same one line, exit status 2."""
    from lightning_dist.plan import main

    for overrides in PLANNER_CASES:
        run_dir = tmp_path / str(len(list(tmp_path.iterdir())))
        status, lines = run_in_process([*overrides, "plan.only=true"], run_dir, monkeypatch, capsys)
        assert status == 2 and len(lines) == 1, lines
        with pytest.raises(SystemExit) as planner:
            main(list(overrides))
        assert planner.value.code == 2, overrides
        assert capsys.readouterr().err.splitlines() == lines, overrides


def test_without_validation_a_short_validation_split_is_no_error(tmp_path, monkeypatch, capsys):
    """trainer.val_check_interval=null: no validation, so a validation split of no window (30
    tokens of data.seq_len=32) passes the checks, and the data module trains without it."""
    from lightning_dist.lm.data import TextDataModule

    corpus = write(tmp_path / "small.txt", "word " * 300)
    overrides = fast(f"data.paths=[{corpus}]", "data.seq_len=32", data="text")
    assert run_in_process(list(overrides), tmp_path / "run", monkeypatch, capsys) == (0, [])
    data = TextDataModule(
        paths=[str(corpus)], seq_len=32, global_batch_size=2, cache_dir=str(tmp_path / "cache")
    )
    assert data.validation_windows() == 0
    data.setup("fit")
    assert len(data.val_set) == 0 and next(iter(data.train_dataloader())).shape == (2, 33)


def test_only_the_environment_or_python_widen_the_allowlist(monkeypatch):
    from lightning_dist.config.targets import ALLOW_TARGETS_ENV, check_target

    monkeypatch.delenv(ALLOW_TARGETS_ENV, raising=False)
    with pytest.raises(ValueError, match="not allowed"):
        check_target("callbacks.slow._target_", "tests.slow_rank.SlowRank", "callbacks")
    monkeypatch.setenv(ALLOW_TARGETS_ENV, "tests.")
    check_target("callbacks.slow._target_", "tests.slow_rank.SlowRank", "callbacks")
    with pytest.raises(ValueError, match="not allowed"):  # the module must match, not the name
        check_target("callbacks.x._target_", "tests.slow_rank.time.sleep", "callbacks")


def test_cpu_processes_are_measured_against_cores_and_memory():
    from lightning_dist.run.checks import check_cpu_capacity

    gib = 2**30
    check_cpu_capacity(8, 10**6, cores=2, memory=16 * gib)  # the test suite's 8 ranks on 2 cores
    with pytest.raises(ValueError, match="17 CPU processes, but this machine has 2 cores"):
        check_cpu_capacity(17, 10**6, cores=2, memory=16 * gib)
    with pytest.raises(ValueError, match=r"need about 120\.7 GiB .* has 64\.0 GiB"):
        check_cpu_capacity(3, 8 * 10**9, cores=64, memory=64 * gib)


def test_what_counts_as_a_secret(monkeypatch):
    from lightning_dist.runtime.redaction import REDACTED, is_secret_key, redact, redact_text

    secret_names = ["WANDB_API_KEY", "api_token", "hf_token", "apiKey", "db_password", "key"]
    assert all(is_secret_key(n) for n in secret_names)
    plain = [
        "tokenizer",
        "data.tokenizer",
        "tokens_per_sec",
        "exclude_keys",
        "TOKENIZERS_PARALLELISM",
    ]
    assert not any(is_secret_key(n) for n in plain)
    monkeypatch.setenv("HF_TOKEN", ENV_SECRET)
    assert (
        redact_text(f"+api_token=abc x=1 y={ENV_SECRET}")
        == f"+api_token={REDACTED} x=1 y={REDACTED}"
    )
    assert redact({"run": {"token": "abc", "tokenizer": "t.json", "note": ENV_SECRET}}) == {
        "run": {"token": REDACTED, "tokenizer": "t.json", "note": REDACTED}
    }
    # A remote source: the URL's user:password and storage_options' keys and secrets.
    source = {"path": "s3://AKIAPLANTED:se/cret@corpus/a.jsonl", "storage_options": {
        "key": "AKIAPLANTED", "secret": "planted/secret", "endpoint_url": "http://127.0.0.1:9",
        "client_kwargs": {"aws_session_token": "planted-session"}}}  # fmt: skip
    assert redact({"sources": [source]}) == {
        "sources": [
            {
                "path": f"s3://{REDACTED}@corpus/a.jsonl",
                "storage_options": {
                    "key": REDACTED,
                    "secret": REDACTED,
                    "endpoint_url": "http://127.0.0.1:9",
                    "client_kwargs": {"aws_session_token": REDACTED},
                },
            }
        ]
    }
    override = (
        "data.sources=[{path: 's3://c/a', storage_options: {key: AKIA0123, secret: 'x/y+z0'}}]"
    )
    assert redact_text(override) == (
        f"data.sources=[{{path: 's3://c/a', storage_options: "
        f"{{key: {REDACTED}, secret: {REDACTED}}}}}]"
    )


def test_schemas_are_not_choices():
    """What `--help` lists and what `group=name` can pick: the YAML configs, no schema."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lightning_dist.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        groups = [g for g in loader.list_groups("") if g != "hydra"]
        options = {g: loader.get_group_options(g) for g in groups}
    assert "ddp" in options["strategy"] and "tiny" in options["model"]
    assert not [f"{g}={o}" for g, names in options.items() for o in names if "schema" in o]


# --- data paths -------------------------------------------------------------------------------


def _tree(tmp: Path) -> Path:
    """corpus/ with a file, a link to a file outside, a link to a folder outside, a link to a
    folder inside, and a loop; outside/ with 3 files."""
    corpus = tmp / "corpus"
    write(corpus / "a.txt", "inside")
    write(corpus / "sub" / "b.txt", "inside too")
    for name in ("x.txt", "y.txt", "z.txt"):
        write(tmp / "outside" / name, "outside")
    (corpus / "out_file.txt").symlink_to(tmp / "outside" / "x.txt")
    (corpus / "out_dir").symlink_to(tmp / "outside")
    (corpus / "in_dir").symlink_to(corpus / "sub")
    (corpus / "sub" / "loop").symlink_to(corpus)
    return corpus


@pytest.mark.parametrize("entry", ["{c}", "{c}/**", "{c}/**/*.txt"])
def test_symlinks_stay_inside_the_data_root(tmp_path, entry):
    corpus = _tree(tmp_path)
    files, skipped = find_files([entry.format(c=corpus)])
    assert [f.relative_to(corpus.resolve()).as_posix() for f in files] == ["a.txt", "sub/b.txt"]
    assert skipped >= 2  # out_file.txt and out_dir
    followed = resolve_files([entry.format(c=corpus)], follow_symlinks=True)
    assert {f.name for f in followed} == {"a.txt", "b.txt", "x.txt", "y.txt", "z.txt"}


def test_what_was_read_is_listed(tmp_path, caplog):
    from lightning_dist.lm.data import TextDataModule

    corpus = _tree(tmp_path)
    with caplog.at_level("INFO", logger="lightning_dist.lm.sources"):
        dm = TextDataModule(paths=[str(corpus)], seq_len=4, global_batch_size=2)
    assert dm.inputs["files"] == 2 and dm.inputs["bytes"] == len("inside") + len("inside too")
    assert dm.inputs["first_paths"] == [
        str(corpus.resolve() / "a.txt"),
        str(corpus.resolve() / "sub/b.txt"),
    ]
    assert dm.inputs["skipped_symlinks"] >= 2
    assert "Reading 2 files, 16 bytes" in caplog.text


# --- W&B without a network --------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _no_network() -> dict:
    """Logged in, but the server is a closed local port; no WANDB_MODE (remove it too)."""
    return {"WANDB_API_KEY": "fake" * 10, "WANDB_BASE_URL": f"http://127.0.0.1:{_closed_port()}"}


def test_wandb_falls_back_offline_within_seconds(tmp_path, monkeypatch, capsys):
    from lightning_dist.run.loggers import wandb_logger

    for key, value in _no_network().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    started = time.monotonic()
    logger = wandb_logger(project="p", save_dir=str(tmp_path))
    assert time.monotonic() - started < 10
    assert logger._wandb_init["mode"] == "offline"
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: W&B server unreachable"), lines
    assert "wandb sync" in lines[0]


def test_wandb_server_is_wandbs_own(tmp_path, monkeypatch):
    """The server and key wandb itself would use: its default host (not a host of ours), the
    host `wandb login --host` saved in its settings file, `WANDB_BASE_URL` over both; a key
    from the environment or from the netrc entry of that host."""
    import wandb

    from lightning_dist.run.loggers import WandbServer, wandb_server

    _set_environment(monkeypatch, WANDB_OFFLINE_LOGIN, tmp_path)
    monkeypatch.delenv("WANDB_BASE_URL")
    assert wandb_server() == WandbServer(url=wandb.Settings().base_url, key_source=None)
    # A key saved by an older wandb login, for api.wandb.ai, serves wandb 0.31's default host.
    write(tmp_path / "netrc", f"machine api.wandb.ai\n  login user\n  password {'k' * 40}\n")
    assert wandb_server().key_source == "netrc"
    write(tmp_path / "wandb_config" / "settings", "[default]\nbase_url = http://127.0.0.1:9\n")
    assert wandb_server() == WandbServer(url="http://127.0.0.1:9", key_source=None)
    write(tmp_path / "netrc", f"machine 127.0.0.1:9\n  login user\n  password {'k' * 40}\n")
    assert wandb_server().key_source == "netrc"
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:8")
    monkeypatch.setenv("WANDB_API_KEY", "fake" * 10)
    assert wandb_server() == WandbServer(url="http://127.0.0.1:8", key_source="WANDB_API_KEY")
