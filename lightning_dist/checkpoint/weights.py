"""Read the model weights of a checkpoint folder in one process, and write weights-only ones.

A checkpoint is a `step<N>.ckpt/` folder of torch.distributed.checkpoint (DCP) files with a
`manifest.json` (format `lightning_dist.checkpoint`, see docs/CHECKPOINTS.md). Its weights are
`state_dict.<name>`, <name> being the single-device model's parameter name. Sharded saves
written before the manifest existed name them `state_dict.model.<name>` (the LightningModule's
attribute) and carry no model description: the run's `.hydra/config.yaml` supplies it.

No process group is needed: DCP reads every shard into this process (`no_dist=True`). Every read
goes through `lightning_dist.checkpoint.safe` (no plain pickle: a restricted unpickler for
`.metadata`, `weights_only=True` for everything else).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lightning_dist._compat import LIGHTNING_CHECKPOINT_METADATA
from lightning_dist.checkpoint.safe import CheckpointError
from lightning_dist.models.args import ModelArgs

FORMAT = "lightning_dist.checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
DCP_METADATA = ".metadata"
WEIGHTS = "state_dict."
LEGACY_WEIGHTS = "state_dict.model."


@contextlib.contextmanager
def one_process_io():
    """Silence DCP's note that it reads or writes in one process: that is the point here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*assuming the intent is to (load|save)")
        yield


def storage_reader(path: Path):
    """The DCP reader of a checkpoint folder: `.metadata` through a restricted unpickler."""
    from lightning_dist.checkpoint.safe import SafeFileSystemReader

    return SafeFileSystemReader(str(path))


@dataclass
class CheckpointInfo:
    """What a checkpoint folder holds, read without loading any tensor."""

    path: Path
    metadata: Any
    """DCP's `Metadata`: every key with its size and dtype."""
    manifest: dict[str, Any] | None
    run_config: dict[str, Any] | None
    """The writing run's `.hydra/config.yaml`, when there is no manifest."""
    weight_prefix: str
    args: ModelArgs | None
    step: int | None
    weight_names: list[str] = field(default_factory=list)

    def tensor_meta(self, name: str):
        """Size and dtype properties of weight `name`."""
        return self.metadata.state_dict_metadata[self.weight_prefix + name]


def open_checkpoint(path: str | Path) -> CheckpointInfo:
    """Describe the checkpoint at `path`; CheckpointError (one line) when it is not one."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"{path} does not exist; give a step<N>.ckpt checkpoint folder")
    if not (path / DCP_METADATA).is_file():
        raise CheckpointError(
            f"{path} is not a checkpoint folder (no {DCP_METADATA}); give a step<N>.ckpt folder "
            "written by a sharded save, or by `python -m lightning_dist.checkpoint import`"
        )
    metadata = storage_reader(path).read_metadata()
    manifest = _read_json(path / MANIFEST)
    if manifest is not None and manifest.get("format") != FORMAT:
        raise CheckpointError(
            f"{path / MANIFEST} has format={manifest.get('format')!r}, not {FORMAT}"
        )
    keys = [k for k in metadata.state_dict_metadata if k.startswith(WEIGHTS)]
    legacy = bool(keys) and all(k.startswith(LEGACY_WEIGHTS) for k in keys)
    prefix = LEGACY_WEIGHTS if legacy else WEIGHTS
    run_config = None if manifest else _run_config(path)
    return CheckpointInfo(
        path=path,
        metadata=metadata,
        manifest=manifest,
        run_config=run_config,
        weight_prefix=prefix,
        args=_model_args(manifest, run_config),
        step=_step(path, manifest),
        weight_names=[k.removeprefix(prefix) for k in keys],
    )


def require_args(info: CheckpointInfo) -> ModelArgs:
    """The model args, or CheckpointError saying where they were looked for."""
    if info.args is None:
        raise CheckpointError(
            f"{info.path} describes no lightning_dist Transformer: no model in {MANIFEST}, and no "
            ".hydra/config.yaml of a run with a model=<ModelArgs config> beside it"
        )
    return info.args


def read_weights(info: CheckpointInfo, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every weight of the checkpoint as a whole tensor in this process, by parameter name."""
    from lightning_dist.checkpoint.safe import load

    state = {}
    for name in info.weight_names:
        meta = info.tensor_meta(name)
        state[info.weight_prefix + name] = torch.empty(meta.size, dtype=meta.properties.dtype)
    with one_process_io():
        load(state, info.path, no_dist=True)
    out = {k.removeprefix(info.weight_prefix): v for k, v in state.items()}
    return {k: v.to(dtype) for k, v in out.items()} if dtype else out


def write_weights_checkpoint(state: dict[str, torch.Tensor], args: ModelArgs, out: Path,
                             source: str) -> dict[str, Any]:  # fmt: skip
    """Write `state` as a weights-only checkpoint folder (step 0, no optimizer) with its
    manifest; return the manifest. `source` says where the weights came from."""
    from torch.distributed.checkpoint import FileSystemWriter, save

    if out.exists():
        raise CheckpointError(f"{out} already exists; give a new folder name")
    out.mkdir(parents=True)
    with one_process_io():
        writer = FileSystemWriter(str(out))
        save({WEIGHTS + k: v for k, v in state.items()}, storage_writer=writer, no_dist=True)
    n_params = sum(v.numel() for k, v in state.items() if not _is_tied_copy(k, args))
    dtype = next(iter(state.values())).dtype
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "step": 0,
        "model": {**dataclasses.asdict(args), "parameters": n_params},
        "layout": {"dp_replicate": 1, "dp_shard": 1, "tp": 1, "pp": 1, "world_size": 1},
        "strategy": None,
        "data": None,
        "precision": str(dtype).removeprefix("torch."),
        "versions": {"torch": torch.__version__},
        "source": source,
        "optimizer": False,
        "files": {p.name: _sha256(p) for p in sorted(out.iterdir()) if p.is_file()},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def model_overrides(model_args) -> list[str]:
    """The `train.py` overrides that build exactly this model."""
    a = model_args
    values = dict(
        dim=a.dim, n_layers=a.n_layers, n_heads=a.n_heads, n_kv_heads=a.kv_heads,
        vocab_size=a.vocab_size, ffn_hidden_size=a.hidden_dim, norm_eps=a.norm_eps,
        rope_theta=a.rope_theta, max_seq_len=a.max_seq_len, tie_embeddings=a.tie_embeddings,
    )  # fmt: skip
    return ["model=llama_debug", *(f"model.{k}={str(v).lower() if isinstance(v, bool) else v}"
                                   for k, v in values.items())]  # fmt: skip


def _is_tied_copy(name: str, args: ModelArgs) -> bool:
    return args.tie_embeddings and name == "output.weight"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON ({e})") from e


def _run_config(path: Path) -> dict[str, Any] | None:
    # Checkpoints go to <run dir>/checkpoints/step<N>.ckpt by default.
    for run_dir in (path.parent.parent, path.parent):
        config = run_dir / ".hydra" / "config.yaml"
        if config.is_file():
            from omegaconf import OmegaConf

            return OmegaConf.to_container(OmegaConf.load(config), resolve=False)
    return None


def _model_args(manifest: dict | None, run_config: dict | None) -> ModelArgs | None:
    model = (manifest or {}).get("model") or (run_config or {}).get("model") or {}
    if manifest is None and not str(model.get("_target_", "")).endswith("ModelArgs"):
        return None
    names = {f.name for f in dataclasses.fields(ModelArgs)}
    kwargs = {k: v for k, v in model.items() if k in names}
    return ModelArgs(**kwargs) if kwargs else None


def _step(path: Path, manifest: dict | None) -> int | None:
    if manifest and manifest.get("step") is not None:
        return int(manifest["step"])
    meta = path / LIGHTNING_CHECKPOINT_METADATA
    if meta.is_file():  # Lightning's loop state; never plain pickle
        return int(torch.load(meta, weights_only=True).get("global_step", 0))
    match = re.match(r"^step(\d+)\.ckpt$", path.name)
    return int(match.group(1)) if match else None
