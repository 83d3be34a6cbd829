"""`python -m lightning_dist.checkpoint inspect|export|import|consolidate ...`.

    inspect      <ckpt>                     model, layout, step, sizes, in one screen
    export       <ckpt> --to hf <dir>       a Hugging Face model directory (config, safetensors,
                                            the tokenizer's files)
    import       <hf_dir> <ckpt>            an HF Llama/Mistral/Mixtral directory as a step-0
                                            checkpoint
    consolidate  <ckpt> <file.safetensors>  every weight in one file, by our parameter names

Mistakes (a missing path, a folder that is not a checkpoint, an architecture our model cannot
represent) stop with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PROG = "python -m lightning_dist.checkpoint"


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage mistakes are one line, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message}; see `{self.prog} --help`", file=sys.stderr, flush=True)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="Inspect and convert lightning_dist checkpoints.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    p = commands.add_parser("inspect", help="model, layout, step and sizes of a checkpoint")
    p.add_argument("checkpoint", type=Path)
    p = commands.add_parser("export", help="write a Hugging Face model directory")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--to", choices=["hf"], required=True, help="target format")
    p.add_argument("out", type=Path, help="new directory for config.json + model.safetensors")
    p.add_argument("--dtype", choices=DTYPES, help="cast the weights (default: as saved)")
    p.add_argument(
        "--tokenizer",
        metavar="byte|none|PATH",
        help="the tokenizer the model was trained with: byte, a tokenizer.json, or none "
        "(default: the writing run's data.tokenizer, from its .hydra/config.yaml)",
    )
    p = commands.add_parser("import", help="an HF Llama/Mistral/Mixtral directory -> a checkpoint")
    p.add_argument("hf_dir", type=Path)
    p.add_argument("out", type=Path, help="new checkpoint folder, e.g. imported/step0.ckpt")
    p.add_argument("--dtype", choices=DTYPES, help="cast the weights (default: as saved)")
    p = commands.add_parser("consolidate", help="every weight in one .safetensors file")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("out", type=Path, help="new .safetensors file")
    p.add_argument("--dtype", choices=DTYPES, help="cast the weights (default: as saved)")
    return parser


def inspect_command(args: argparse.Namespace) -> None:
    from lightning_dist.checkpoint.describe import describe
    from lightning_dist.checkpoint.weights import open_checkpoint

    print(describe(open_checkpoint(args.checkpoint)))


def export_command(args: argparse.Namespace) -> None:
    from safetensors.torch import save_file

    from lightning_dist.checkpoint.hf import (
        hf_config,
        hf_tokenizer_files,
        mixtral_problem,
        to_hf,
        token_ids,
    )
    from lightning_dist.checkpoint.weights import open_checkpoint, read_weights, require_args
    from lightning_dist.models.args import MoEArgs

    info = open_checkpoint(args.checkpoint)
    model_args = require_args(info)
    problem = mixtral_problem(model_args) if isinstance(model_args, MoEArgs) else None
    if problem:
        raise ValueError(
            f"{info.path} holds a mixture of experts that export --to hf cannot "
            f"write as MixtralForCausalLM: {problem}"
        )
    tokenizer, origin = export_tokenizer(info.path, args.tokenizer)
    if tokenizer is not None and tokenizer.vocab_size > model_args.vocab_size:
        raise ValueError(
            f"the tokenizer ({origin}) has {tokenizer.vocab_size} ids, the model's "
            f"vocabulary {model_args.vocab_size}; give --tokenizer"
        )
    _new_path(args.out)
    state = to_hf(read_weights(info, DTYPES.get(args.dtype)), model_args)
    args.out.mkdir(parents=True)
    dtype = next(iter(state.values())).dtype
    save_file(state, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    config = hf_config(model_args, dtype, tokenizer)
    files = {"config.json": config, "generation_config.json": token_ids(tokenizer)}
    files = {name: json.dumps(value, indent=2) + "\n" for name, value in files.items()}
    if tokenizer is not None:
        files.update(hf_tokenizer_files(tokenizer, model_args.max_seq_len))
    for name, text in files.items():
        (args.out / name).write_text(text, encoding="utf-8")
    print(
        f"exported step {info.step} of {info.path} to {args.out} "
        f"({config['architectures'][0]}, {dtype}); "
        + (
            f"tokenizer: {origin}"
            if tokenizer is not None
            else f"no tokenizer files ({origin}; --tokenizer byte|PATH adds them)"
        )
    )


def export_tokenizer(checkpoint: Path, choice: str | None):
    """(tokenizer, where it came from) for `export`: `--tokenizer` (byte, a tokenizer.json, none),
    else the writing run's `data.tokenizer` (None, byte-level, for text data), else none (synthetic
    data, or no run config: an imported checkpoint)."""
    from lightning_dist.checkpoint.weights import writing_run_config
    from lightning_dist.lm.tokenizer import describe, load_tokenizer

    where = "--tokenizer"
    if choice is None:
        data = (writing_run_config(checkpoint) or {}).get("data") or {}
        if "tokenizer" not in data:
            return None, "the run that wrote it names no tokenizer"
        choice, where = data["tokenizer"], "the run's data.tokenizer"
    elif choice.lower() == "none":
        return None, "--tokenizer none"
    try:
        tokenizer = load_tokenizer(choice)
    except FileNotFoundError as err:  # a relative path of the run's, read from elsewhere
        raise FileNotFoundError(f"{err} ({where}); give --tokenizer PATH, or none") from None
    return tokenizer, f"{describe(tokenizer)} ({where})"


def import_command(args: argparse.Namespace) -> None:
    from safetensors.torch import load_file

    from lightning_dist.checkpoint.hf import from_hf, model_args_from_hf
    from lightning_dist.checkpoint.weights import (
        CheckpointError,
        model_overrides,
        write_weights_checkpoint,
    )

    hf_dir = args.hf_dir.expanduser()
    files = sorted(hf_dir.glob("*.safetensors"))
    if not (hf_dir / "config.json").is_file() or not files:
        raise CheckpointError(
            f"{hf_dir} is not a Hugging Face safetensors model directory (needs config.json and "
            "*.safetensors; save one with save_pretrained(dir), whose default is safetensors)"
        )
    model_args = model_args_from_hf(hf_dir)
    _new_path(args.out)
    hf_state = {}
    for file in files:
        hf_state.update(load_file(str(file)))
    state = from_hf(hf_state, model_args)
    if args.dtype:
        state = {k: v.to(DTYPES[args.dtype]) for k, v in state.items()}
    model_type = json.loads((hf_dir / "config.json").read_text()).get("model_type")
    manifest = write_weights_checkpoint(
        state, model_args, args.out, source=f"huggingface:{model_type}:{hf_dir}"
    )
    overrides = " ".join(model_overrides(model_args))
    print(
        f"imported {model_type} ({manifest['model']['parameters']:,} parameters) into "
        f"{args.out}\ntrain from it under any layout:\n  python train.py "
        f"trainer.init_from={args.out} {overrides}"
    )


def consolidate_command(args: argparse.Namespace) -> None:
    from safetensors.torch import save_file

    from lightning_dist.checkpoint.weights import open_checkpoint, read_weights

    info = open_checkpoint(args.checkpoint)
    _new_path(args.out)
    state = read_weights(info, DTYPES.get(args.dtype))
    metadata = {"format": "pt", "step": str(info.step)}
    if info.args is not None:
        metadata["lightning_dist.model"] = json.dumps(info.args.__dict__)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(args.out), metadata=metadata)
    size = args.out.stat().st_size
    print(f"consolidated {len(state)} tensors of step {info.step} into {args.out} ({size:,} bytes)")


def _new_path(path: Path) -> Path:
    from lightning_dist.checkpoint.weights import CheckpointError

    if path.exists():
        raise CheckpointError(f"{path} already exists; give a new path")
    return path


COMMANDS = {
    "inspect": inspect_command,
    "export": export_command,
    "import": import_command,
    "consolidate": consolidate_command,
}


def main(argv: list[str] | None = None) -> int:
    from lightning_dist.checkpoint.weights import CheckpointError

    args = build_parser().parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except (CheckpointError, FileNotFoundError, ValueError, ImportError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
        return 2
    return 0
