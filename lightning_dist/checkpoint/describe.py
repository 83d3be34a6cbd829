"""`inspect`: what a checkpoint holds (model, layout, step, sizes), in one screen of text."""

from __future__ import annotations

import re
from collections import Counter

from lightning_dist.checkpoint.manifest import MANIFEST
from lightning_dist.checkpoint.weights import CheckpointInfo
from lightning_dist.runtime.strategy_names import current_name

SHARD_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")
OPTIMIZER_STATE = re.compile(r"^optimizer_(\d+)\.state\..*\.([A-Za-z_]+)$")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def describe(info: CheckpointInfo) -> str:
    """The inspect text: one `key  value` line per fact."""
    rows = [("checkpoint", str(info.path)), ("format", _format(info))]
    rows.append(("step", "unknown" if info.step is None else str(info.step)))
    rows.append(("model", _model(info)))
    rows.append(("parameters", _parameters(info)))
    rows.append(("layout", _layout(info)))
    rows.append(("optimizer", _optimizer(info)))
    rows.append(("files", _files(info)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _format(info: CheckpointInfo) -> str:
    if info.manifest:
        return f"{info.manifest['format']} v{info.manifest.get('version')} ({MANIFEST})"
    source = "the run's .hydra/config.yaml" if info.run_config else "nothing"
    return f"DCP folder without {MANIFEST}; model and layout read from {source}"


HF_CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "intermediate_size", "vocab_size",
                  "max_position_embeddings")  # fmt: skip
"""What `inspect` shows of a Hugging Face model's config."""


def _model(info: CheckpointInfo) -> str:
    a = info.args
    if a is None:
        return _other_model(info)
    tied = ", tied embeddings" if a.tie_embeddings else ""
    experts = getattr(a, "num_experts", 0)
    kind = "MoETransformer" if experts else "Transformer"
    moe = (
        f" num_experts={experts} top_k={a.top_k} expert_hidden_size={a.expert_dim} "
        f"n_shared_experts={a.n_shared_experts} first_k_dense={a.first_k_dense}"
        if experts
        else ""
    )
    return (
        f"{kind} dim={a.dim} n_layers={a.n_layers} n_heads={a.n_heads} "
        f"n_kv_heads={a.kv_heads} ffn_hidden_size={a.hidden_dim} vocab_size={a.vocab_size} "
        f"max_seq_len={a.max_seq_len} rope_theta={a.rope_theta:g} norm_eps={a.norm_eps:g}"
        f"{moe}{tied}"
    )


def _other_model(info: CheckpointInfo) -> str:
    """A model that is no lightning_dist Transformer, as its manifest (or, without one, its run's
    config) records it: a Hugging Face model's spec (`model=hf_llama`), or nothing."""
    source = (
        MANIFEST if info.manifest else "the run's .hydra/config.yaml" if info.run_config else ""
    )
    if not source:
        return f"unknown (no {MANIFEST}, no run config)"
    model = (info.manifest or info.run_config or {}).get("model") or {}
    if not {"config", "pretrained_path"} & set(model):
        return f"not recorded in {source} (a model without a lightning_dist model_spec)"
    config = model.get("config") or {}
    fields = " ".join(f"{k}={config[k]}" for k in HF_CONFIG_KEYS if k in config)
    origin = f" from {model['pretrained_path']}" if model.get("pretrained_path") else ""
    kind = config.get("model_type", "llama") if config else "model"
    return f"Hugging Face {kind}{origin} {fields}".rstrip() + f" (model=hf_llama, {source})"


def _parameters(info: CheckpointInfo) -> str:
    tied = info.args is not None and info.args.tie_embeddings
    total, dtypes = 0, Counter()
    for name in info.weight_names:
        meta = info.tensor_meta(name)
        if tied and name == "output.weight":
            continue
        total += meta.size.numel()
        dtypes[str(meta.properties.dtype).removeprefix("torch.")] += meta.size.numel()
    kinds = ", ".join(dtypes)
    return f"{total:,} in {len(info.weight_names)} tensors ({kinds or 'none'})"


def _layout(info: CheckpointInfo) -> str:
    if info.manifest and info.manifest.get("layout"):
        layout = dict(info.manifest["layout"])
        strategy = info.manifest.get("strategy")
        strategy = strategy and current_name(strategy)  # a checkpoint of an old name's time
        world = layout.pop("world_size", None)
        degrees = " ".join(f"{k}={v}" for k, v in layout.items())
        head = f"strategy={strategy} " if strategy else ""
        return f"{head}{degrees} (world size {world})"
    ranks = {int(m.group(1)) for p in info.path.iterdir() if (m := SHARD_FILE.match(p.name))}
    strategy = ((info.run_config or {}).get("strategy") or {}).get("name", "unknown")
    return f"strategy={strategy}, written by {len(ranks)} rank(s)"


def _optimizer(info: CheckpointInfo) -> str:
    kinds: dict[int, set[str]] = {}
    for key in info.metadata.state_dict_metadata:
        if m := OPTIMIZER_STATE.match(key):
            kinds.setdefault(int(m.group(1)), set()).add(m.group(2))
    if not kinds:
        return "none (weights only)"
    return "; ".join(f"optimizer_{i}: {', '.join(sorted(k))}" for i, k in sorted(kinds.items()))


def _files(info: CheckpointInfo) -> str:
    files = sorted((p for p in info.path.iterdir() if p.is_file()), key=lambda p: p.name)
    sizes = [(p.name, p.stat().st_size) for p in files]
    total = sum(s for _, s in sizes)
    listed = ", ".join(f"{n} {human_bytes(s)}" for n, s in sizes[:6])
    more = f", and {len(sizes) - 6} more" if len(sizes) > 6 else ""
    return f"{len(sizes)} files, {human_bytes(total)}: {listed}{more}"
