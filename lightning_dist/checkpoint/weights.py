"""Read the model weights of a checkpoint folder in one process, and write weights-only ones.

A checkpoint is a `step<N>.ckpt/` folder of torch.distributed.checkpoint (DCP) files with a
`manifest.json` (format `lightning_dist.checkpoint`, see docs/CHECKPOINTS.md and format.py). Its
weights are `state_dict.model.<name>` (`format.WEIGHTS`), <name> being the single-device model's
parameter name; that is the one naming every writer uses, this module's `import` included.
Sharded saves written before the manifest existed name them the same way and carry no model
description: the run's `.hydra/config.yaml` supplies it.

A folder with a manifest is verified (`manifest.open_manifest`: format version and every file's
hash) before anything in it is read. No process group is needed: DCP reads every shard into this
process (`no_dist=True`). Every read goes through `lightning_dist.checkpoint.safe` (no plain
pickle: a restricted unpickler for `.metadata`, `weights_only=True` for everything else).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lightning_dist._compat import LIGHTNING_CHECKPOINT_METADATA
from lightning_dist.checkpoint.format import (
    WEIGHTS,
    one_process_io,
    read_values,
    storage_reader,
)
from lightning_dist.checkpoint.manifest import MANIFEST, open_manifest, write_manifest
from lightning_dist.checkpoint.safe import CheckpointError
from lightning_dist.models.args import ModelArgs, MoEArgs

DCP_METADATA = ".metadata"


@dataclass
class CheckpointInfo:
    """What a checkpoint folder holds, read without loading any tensor."""

    path: Path
    metadata: Any
    """DCP's `Metadata`: every key with its size and dtype."""
    manifest: dict[str, Any] | None
    run_config: dict[str, Any] | None
    """The writing run's `.hydra/config.yaml`, when there is no manifest."""
    args: ModelArgs | None
    step: int | None
    weight_names: list[str] = field(default_factory=list)

    def tensor_meta(self, name: str):
        """Size and dtype properties of weight `name`."""
        return self.metadata.state_dict_metadata[WEIGHTS + name]


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
    # Verified (version, every file's hash) before any file is deserialised.
    manifest = open_manifest(path) if (path / MANIFEST).is_file() else None
    metadata = storage_reader(path).read_metadata()
    keys = [k for k in metadata.state_dict_metadata if k.startswith(WEIGHTS)]
    run_config = None if manifest else writing_run_config(path)
    return CheckpointInfo(
        path=path,
        metadata=metadata,
        manifest=manifest,
        run_config=run_config,
        args=model_args_of(manifest, run_config),
        step=_step(path, manifest),
        weight_names=[k.removeprefix(WEIGHTS) for k in keys],
    )


def require_args(info: CheckpointInfo) -> ModelArgs:
    """The model args, or CheckpointError saying where they were looked for."""
    if info.args is None:
        where = (
            f"its {MANIFEST} records another model (model=hf_llama keeps the Hugging Face "
            "names, under hf_model.; `consolidate` writes them to one file)"
            if info.manifest
            else "it has no manifest.json, and no .hydra/config.yaml of a run with a "
            "model=<ModelArgs config> beside it"
        )
        raise CheckpointError(f"{info.path} holds no lightning_dist Transformer: {where}")
    return info.args


def read_weights(info: CheckpointInfo, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every weight of the checkpoint as a whole tensor in this process, by parameter name."""
    state = read_values(info.path, WEIGHTS)  # open_checkpoint verified the manifest
    out = {k.removeprefix(WEIGHTS): v for k, v in state.items()}
    return {k: v.to(dtype) for k, v in out.items()} if dtype else out


def write_weights_checkpoint(
    state: dict[str, torch.Tensor], args: ModelArgs, out: Path, source: str
) -> dict[str, Any]:
    """Write `state` as a weights-only checkpoint folder (step 0, no optimizer) with its
    manifest; return the manifest. `source` says where the weights came from."""
    from torch.distributed.checkpoint import FileSystemWriter, save

    if out.exists():
        raise CheckpointError(f"{out} already exists; give a new folder name")
    out.mkdir(parents=True)
    with one_process_io():
        writer = FileSystemWriter(str(out))
        save({WEIGHTS + k: v for k, v in state.items()}, storage_writer=writer, no_dist=True)
    # The model's parameters, as the strategies' manifests count them: no buffer (a router's
    # expert_bias), the tied output projection once.
    n_params = args.num_params()
    dtype = next(iter(state.values())).dtype
    fields = {
        "step": 0,
        "model": {**dataclasses.asdict(args), "parameters": n_params},
        "layout": {"dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1, "pp": 1, "world_size": 1},
        "strategy": None,
        "data": None,
        "precision": str(dtype).removeprefix("torch."),
        "versions": {"torch": torch.__version__},
        "source": source,
        "optimizer": False,
    }
    return write_manifest(out, fields)


def model_overrides(model_args) -> list[str]:
    """The `train.py` overrides that build exactly this model (`model=moe_debug` plus every MoE
    option for a mixture of experts, so none of moe_debug's own is left)."""
    a = model_args
    values = dict(
        dim=a.dim,
        n_layers=a.n_layers,
        n_heads=a.n_heads,
        n_kv_heads=a.kv_heads,
        vocab_size=a.vocab_size,
        ffn_hidden_size=a.hidden_dim,
        norm_eps=a.norm_eps,
        rope_theta=a.rope_theta,
        max_seq_len=a.max_seq_len,
        tie_embeddings=a.tie_embeddings,
    )
    if isinstance(a, MoEArgs):
        values.update(
            num_experts=a.num_experts,
            top_k=a.top_k,
            expert_hidden_size=a.expert_dim,
            n_shared_experts=a.n_shared_experts,
            first_k_dense=a.first_k_dense,
            score_func=a.score_func,
            route_norm=a.route_norm,
            route_scale=a.route_scale,
            aux_loss_coeff=a.aux_loss_coeff,
            bias_update_rate=a.bias_update_rate,
        )
    flavor = "model=moe_debug" if isinstance(a, MoEArgs) else "model=llama_debug"
    return [
        flavor,
        *(f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()),
    ]


ARCHITECTURE = ("n_heads", "kv_heads", "vocab_size", "rope_theta", "norm_eps", "tie_embeddings")
"""What a checkpoint's model must share with the configured one beyond the weights' shapes: the
heads' split of wq and wk (n_heads 4 and 8 give the same shapes), the rotary base, the norm's
epsilon and tied embeddings change the function; the vocabulary is named before any shape."""
EXPERT_ARCHITECTURE = (
    "num_experts",
    "top_k",
    "expert_dim",
    "n_shared_experts",
    "first_k_dense",
    "score_func",
    "route_norm",
    "route_scale",
)
"""What two mixtures of experts (`MoEArgs`) must share besides `ARCHITECTURE`: the experts
named before their 3-D weights' shapes, and the routing (the renormalisation and scale of the
weights change the function, not a shape)."""


def architecture_difference(theirs: ModelArgs | None, ours: Any) -> str | None:
    """How the checkpoint's model (`theirs`, from its manifest) differs from the configured one,
    as `was written for model.<key>=<value>, the configured model has <value>`; None when they
    agree, or when either is not a lightning_dist Transformer (the shapes decide then)."""
    if theirs is None or not isinstance(ours, ModelArgs | MoEArgs):
        return None
    if isinstance(theirs, MoEArgs) != isinstance(ours, MoEArgs):
        experts = [getattr(a, "num_experts", 0) for a in (theirs, ours)]
        return (
            f"was written for model.num_experts={experts[0] or 'none (dense)'}, the "
            f"configured model has {experts[1] or 'none (dense)'}"
        )
    for key in ARCHITECTURE + (EXPERT_ARCHITECTURE if isinstance(ours, MoEArgs) else ()):
        if getattr(theirs, key) != getattr(ours, key):
            name = "n_kv_heads" if key == "kv_heads" else key
            return (
                f"was written for model.{name}={getattr(theirs, key)}, the configured model "
                f"has {getattr(ours, key)}"
            )
    return None


def writing_run_config(path: Path) -> dict[str, Any] | None:
    """The `.hydra/config.yaml` of the run that wrote the checkpoint folder `path`, unresolved,
    or None. Checkpoints go to <run dir>/checkpoints/step<N>.ckpt by default."""
    for run_dir in (path.parent.parent, path.parent):
        config = run_dir / ".hydra" / "config.yaml"
        if config.is_file():
            from omegaconf import OmegaConf

            return OmegaConf.to_container(OmegaConf.load(config), resolve=False)
    return None


def model_args_of(
    manifest: dict | None, run_config: dict | None = None
) -> ModelArgs | MoEArgs | None:
    """The model a checkpoint was written for: its manifest's, else its run's config's
    (`MoEArgs` where it has experts)."""
    model = (manifest or {}).get("model") or (run_config or {}).get("model") or {}
    if manifest is None and not str(model.get("_target_", "")).endswith(("ModelArgs", "MoEArgs")):
        return None
    kind = MoEArgs if "num_experts" in model else ModelArgs
    names = {f.name for f in dataclasses.fields(kind)}
    kwargs = {k: v for k, v in model.items() if k in names}
    return kind(**kwargs) if kwargs else None


def _step(path: Path, manifest: dict | None) -> int | None:
    if manifest and manifest.get("step") is not None:
        return int(manifest["step"])
    meta = path / LIGHTNING_CHECKPOINT_METADATA
    if meta.is_file():  # Lightning's loop state; never plain pickle
        return int(torch.load(meta, weights_only=True).get("global_step", 0))
    match = re.match(r"^step(\d+)\.ckpt$", path.name)
    return int(match.group(1)) if match else None
