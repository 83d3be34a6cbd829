"""What the planner prints: the assumptions, the table of layouts, its legend and notes, the
chosen layout's prediction with its band, and the `python train.py ...` command of a row. The
planner CLI (`lightning_dist/plan.py`) and the pre-flight of `train.py` (`run/preflight.py`)
both print through it."""

from __future__ import annotations

import shlex
import sys
from typing import Any

from lightning_dist.layout import Batch
from lightning_dist.planner.advice import slow_link_advice
from lightning_dist.planner.estimate import evaluate
from lightning_dist.planner.labels import (
    COMMAND_STRATEGIES,
    batch_line,
    format_seconds,
    stage_lines,
)
from lightning_dist.planner.settings import COMPILE_SPEEDUP, DEFAULT_HEADROOM, state_bytes
from lightning_dist.planner.space import CP_MIN_SEQ_LEN

LEGEND = f"""legend: the first word is the strategy that runs the row: single, ddp, fsdp2, tp, pp or 3d (data x tensor x
  pipeline), as in `python train.py strategy=...` (--command N prints row N's command).
  dp_replicate = data-parallel replicas; dp_shard = data-parallel ranks that shard the model states
  (FSDP); cp = context-parallel ranks, each holding 1/cp of every sequence, with their mode
  (allgather or ulysses; tried for sequences of {CP_MIN_SEQ_LEN} tokens or more); tp = tensor-parallel ranks;
  pp = pipeline stages, with their schedule (v = virtual stages per rank). Where FSDP shards
  (over dp_shard x cp > 1), its mode: FULL_SHARD, SHARD_GRAD_OP (parameters stay gathered from
  forward to backward; fsdp2's reshard_after_forward=false), HYBRID_SHARD (FULL_SHARD inside the
  shard group, replicated over dp_replicate).
  mbs = micro-batch: the sequences one rank runs through one forward (one pipeline microbatch
  under pp); the rest of the global batch is gradient accumulation or further microbatches.
  ac = activation checkpointing: ac=full (every block keeps only its input), ac=n (every n-th
  block in full), ac=op (every block keeps its matmul outputs, recomputes the pointwise ops),
  ac=op_alternate (op keeping every other matmul's output); compile = per-block torch.compile;
  offload = parameters, gradients and optimizer state live in host memory (FSDP CPU offload),
  so `host GiB` holds them instead of the device; ep = expert-parallel ranks of a mixture of
  experts (borrowed from dp_shard: each holds 1/ep of every MoE layer's experts).
  SHARD_OPTIMIZER = ZeRO-1: parameters and gradients whole on every replica, optimizer states
  sharded over dp_replicate (strategy.shard_optimizer=true). A row marked "planner only" is one
  train.py cannot run yet (more pipeline chunks than layers): it is never chosen and has no
  command.
  GiB/dev = predicted peak per device; step, tok/s, MFU = predicted; comm/comp = communication
  over compute time; bubble = pipeline idle fraction."""

OPTIMIZER_NAMES = {"adamw": "AdamW", "adam": "Adam", "sgd_momentum": "SGD+momentum", "sgd": "SGD"}

LARGE_MODEL_PARAMS = 1e9
"""From this size on, a global batch of under `REALISTIC_TOKENS_PER_STEP / 4` tokens is noted."""
REALISTIC_TOKENS_PER_STEP = 2**21
"""About what models of 1B parameters and more train with per optimizer step (2M tokens)."""


CPU_MODELS = ("tiny", "llama_debug")
"""The model configs made for CPUs and tests (`tiny` is train.py's default)."""
SMALL_MODEL_PARAMS = 100e6
"""Below this many parameters a model planned on GPUs is warned about (GPT-2 small has 124M)."""
GPU_MODELS = ("llama3_8b", "llama3_1b")
"""What the warning suggests instead: the first whose weights, gradients and AdamW states fill at
most `GPU_MODEL_MEMORY_SHARE` of all the devices' memory."""
GPU_MODEL_MEMORY_SHARE = 0.5


def compile_settings(strategy: Any) -> dict[str, Any]:
    """`compile` and `compile_backend` of the configured strategy (its config section), as the
    planner takes them (strategies without them, such as strategy=auto, do not compile)."""
    strategy = strategy or {}
    return {
        "compile": bool(strategy.get("compile", False)),
        "compile_backend": str(strategy.get("compile_backend", "inductor")),
    }


def _gib(nbytes: float) -> str:
    return f"{nbytes / 1024**3:.1f}"


# --- train.py overrides of a candidate --------------------------------------------------------


def _flag(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def strategy_overrides(candidate) -> list[str]:
    """The `strategy=...` and `data.per_rank_batch_size` overrides that make train.py run this
    candidate's layout and settings: the strategy its label names (`Candidate.strategy`) and the
    degrees that preset does not fill by itself (`3d` runs every layout, CPU offload included)."""

    lay, st = candidate.layout, candidate.settings
    name = candidate.strategy if candidate.strategy in COMMAND_STRATEGIES else "3d"
    zero2 = lay.shard_size > 1 and st.sharding == "SHARD_GRAD_OP"
    out = [f"strategy={name}"]
    if name == "fsdp2":  # its dp_replicate default is one group per node; dp_shard the rest
        out.append(f"strategy.dp_replicate={lay.dp_replicate}")
    elif name == "3d":  # dp_shard (-1) takes the ranks the others leave
        out += [f"strategy.{k}={v}" for k, v in lay.degrees().items() if k != "dp_shard" and v > 1]
        if lay.ep > 1:
            out.append(f"strategy.ep={lay.ep}")
    if lay.pp > 1:
        out += [
            f"strategy.schedule={lay.schedule}",
            f"strategy.microbatches={candidate.grad_accumulation}",
        ]
        if lay.virtual_stages > 1:
            out.append(f"strategy.virtual_stages={lay.virtual_stages}")
        points = st.options.pipeline.split_points
        if points:
            out.append(f"strategy.split_points=[{','.join(map(str, points))}]")
    if lay.cp > 1:
        out.append(f"strategy.cp_mode={st.cp_mode}")
    if lay.tp > 1 and not st.sequence_parallel:  # on by default under TP
        out.append("strategy.sequence_parallel=false")
    if st.offload:
        out.append("strategy.cpu_offload=true")
    if zero2:
        out.append("strategy.reshard_after_forward=false")
    if st.sharding == "SHARD_OPTIMIZER":
        out.append("strategy.shard_optimizer=true")
    if st.activation_checkpointing.enabled:
        out.append(f"strategy.activation_checkpointing={st.activation_checkpointing.setting}")
    if st.compile:
        out += ["strategy.compile=true", f"strategy.compile_backend={st.compile_backend}"]
    if lay.pp == 1 and candidate.grad_accumulation > 1:  # else each rank's whole share at once
        out.append(f"data.per_rank_batch_size={st.micro_batch_size}")
    return out


def _is_layout_override(item: str) -> bool:
    key = item.lstrip("+~").partition("=")[0]
    batch = ("data.per_rank_batch_size", "data.micro_batch_size")
    return key in ("strategy", *batch) or key.startswith(("strategy.", "plan."))


def train_command(base: list[str], candidate) -> str:
    """`python train.py BASE STRATEGY...`: the user's overrides (without their strategy, batch
    split or plan.* ones) plus this candidate's."""
    layout = strategy_overrides(candidate)
    kept = [o for o in base if not _is_layout_override(o)]
    return "python train.py " + shlex.join([*kept, *layout])


def _wrapped(command: str, width: int = 110) -> str:
    """A long command over several shell lines (backslash continuations), each under `width`."""
    lines, line = [], ""
    for word in command.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = "    " + word
        else:
            line = f"{line} {word}" if line else word
    return " \\\n".join([*lines, line])


def hydra_task_overrides() -> list[str]:
    """The command-line overrides of the running train.py (empty outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


# --- what the plan assumed --------------------------------------------------------------------


def config_choice(overrides: list[str], group: str) -> str:
    """The config chosen for `group` by these overrides, else conf/train.yaml's default."""
    for item in reversed(overrides):
        key, sep, value = item.lstrip("+").partition("=")
        if sep and key == group:
            return value
    from omegaconf import OmegaConf

    from lightning_dist.config import CONF_DIR

    for entry in OmegaConf.load(CONF_DIR / "train.yaml").defaults:
        if isinstance(entry, dict | type(OmegaConf.create({}))) and group in entry:
            return str(entry[group])
    return "?"


def _size(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _config_params(name: str) -> int:
    """Parameters of the model config `conf/model/<name>.yaml` (our ModelArgs flavors)."""
    from omegaconf import OmegaConf

    from lightning_dist.config import CONF_DIR
    from lightning_dist.models.args import ModelArgs

    fields = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml"))
    fields = {k: v for k, v in fields.items() if k not in ("defaults", "_target_")}
    return ModelArgs(**fields).num_params()


def gpu_model_suggestion(hardware) -> str:
    """The model config to plan on this GPU hardware instead of a CPU one (GPU_MODELS)."""

    if not hardware.memory_gib:
        return GPU_MODELS[-1]
    devices = hardware.resolved_devices() * hardware.num_nodes
    budget = GPU_MODEL_MEMORY_SHARE * hardware.memory_gib * 2**30 * devices
    per_param = sum(state_bytes("bf16-mixed", "adamw"))
    return next((m for m in GPU_MODELS if _config_params(m) * per_param <= budget), GPU_MODELS[-1])


def model_warning(model, hardware, model_name: str) -> str | None:
    """One line when a CPU model (CPU_MODELS, or under SMALL_MODEL_PARAMS parameters) is planned
    on GPU hardware, whose plan says little about training anything real, with the fix."""
    args = model.to_model_args() if hasattr(model, "to_model_args") else model
    params = args.num_params()
    if hardware.accelerator != "gpu" or (
        model_name not in CPU_MODELS and params >= SMALL_MODEL_PARAMS
    ):
        return None
    suggestion = gpu_model_suggestion(hardware)
    return (
        f"warning: model={model_name} ({_size(params)} parameters) is a CPU model, not one to "
        f"train on {hardware.name}; plan with model={suggestion}"
    )


def compile_note(strategy: Any) -> str:
    """One line: whether the plan times the blocks compiled, with which backend and speedup."""

    settings = compile_settings(strategy)
    if not settings["compile"]:
        return "per-block torch.compile: off (strategy.compile)"
    backend = settings["compile_backend"]
    speedup = COMPILE_SPEEDUP.get(backend, 1.0)
    return f"per-block torch.compile: {backend}, compute time / {speedup:.2f} (assumed)"


def assumptions(
    batch: Batch, precision: str | None, strategy: Any, model, hardware, model_name: str
) -> list[str]:
    """The lines every plan starts with: the model, batch, precision (null: the hardware's),
    optimizer, compilation (`strategy`: its config section) and hardware."""
    args = model.to_model_args() if hasattr(model, "to_model_args") else model
    gbs, seq = batch.global_batch_size, batch.seq_len
    precision = precision or hardware.precision
    per_node = hardware.resolved_devices()
    memory = f"{hardware.memory_gib:g} GiB each" if hardware.memory_gib else "memory unknown"
    if hardware.mixed:
        memory = "; ".join(
            f"{k}: {g.num_nodes} x {g.name} ({g.memory_gib:g} GiB)"
            for k, g in hardware.groups.items()
        )
    return [
        f"model {model_name} ({_size(args.num_params())} parameters), {precision}, "
        f"{OPTIMIZER_NAMES['adamw']}; global batch {gbs} x {seq} tokens = {gbs * seq:,} "
        "tokens per step",
        compile_note(strategy),
        f"hardware {hardware.name}: {hardware.num_nodes} node(s) x {per_node} devices, {memory}",
    ]


def plan_notes(batch: Batch, model, hardware, overrides: list[str]) -> list[str]:
    """The warnings under the assumptions, alike in train.py's plan.only and the planner CLI:
    a CPU model on GPUs (`model_warning`), a large model's tiny batch (`batch_note`)."""
    model_name = config_choice(overrides, "model")
    notes = (model_warning(model, hardware, model_name), batch_note(batch, model, overrides))
    return [note for note in notes if note]


def realistic_batch(batch: Batch, model) -> list[str]:
    """The `data.global_batch_size` and `data.seq_len` overrides of a realistic step (about
    REALISTIC_TOKENS_PER_STEP tokens) when a large model is planned with a batch far below
    what it would train with; none otherwise."""
    args = model.to_model_args() if hasattr(model, "to_model_args") else model
    gbs, seq = batch.global_batch_size, batch.seq_len
    if args.num_params() < LARGE_MODEL_PARAMS or gbs * seq >= REALISTIC_TOKENS_PER_STEP // 4:
        return []
    seq_len = min(getattr(args, "max_seq_len", 4096) or 4096, 4096)
    return [
        f"data.global_batch_size={REALISTIC_TOKENS_PER_STEP // seq_len}",
        f"data.seq_len={seq_len}",
    ]


def batch_set_by_user(overrides: list[str]) -> bool:
    """Whether the overrides set the global batch or the sequence length."""
    keys = {o.lstrip("+").partition("=")[0] for o in overrides}
    return bool({"data.global_batch_size", "data.seq_len"} & keys)


def batch_note(batch: Batch, model, overrides: list[str]) -> str | None:
    """A note when a large model is planned with a batch far below what it would train with,
    saying whether that batch is the CPU default and how to set a realistic one."""
    realistic = realistic_batch(batch, model)
    if not realistic:
        return None
    args = model.to_model_args() if hasattr(model, "to_model_args") else model
    gbs, seq = batch.global_batch_size, batch.seq_len
    origin = (
        "as set on the command line"
        if batch_set_by_user(overrides)
        else "the CPU defaults of data=" + config_choice(overrides, "data")
    )
    return (
        f"note: {gbs} x {seq} = {gbs * seq:,} tokens per step ({origin}) is far below the ~2M "
        f"that {_size(args.num_params())}-parameter models train with; for a realistic plan add "
        + " ".join(realistic)
    )


def print_plan(
    result, cfg, model, hardware, top: int = 8, *, overrides: list[str] = (), details: bool = False
) -> None:
    """Print the assumptions, the table of the top `top` candidates (memory by category with
    `details`), the legend, the choice with its train.py command, and some rejections."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    # Piped output gets a fixed width: a folded table is unreadable in a log file.
    console = Console(width=None if sys.stdout.isatty() else (200 if details else 120))
    overrides = list(overrides)

    batch = Batch.of_config(cfg.data)
    precision, strategy = cfg.trainer.get("precision"), cfg.get("strategy")
    for line in assumptions(
        batch, precision, strategy, model, hardware, config_choice(overrides, "model")
    ):
        console.print(line, highlight=False)
    for note in plan_notes(batch, model, hardware, overrides):  # a warning is one line
        console.print(f"[yellow]{note}[/]", highlight=False, soft_wrap=note.startswith("warn"))
    if hardware.peak_tflops_bf16 is None or hardware.intra_node_gbytes_per_sec is None:
        console.print(
            "[yellow]this hardware spec has no peak FLOP/s or link bandwidth: times use nominal "
            "figures and only rank the layouts[/]"
        )
    shown = result.candidates[:top]
    host = any(c.memory.host for c in shown)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("layout", justify="left", overflow="fold")
    categories = ("params", "grads", "optim", "acts", "buffers") if details else ()
    numbers = (
        *categories,
        "GiB/dev",
        *(("host GiB",) if host else ()),
        "step",
        "tok/s",
        "MFU",
        "comm/comp",
        "bubble",
    )
    for name in numbers:
        table.add_column(name, justify="right", no_wrap=True)
    for i, cand in enumerate(shown):
        mem, t = cand.memory, cand.time
        by_category = (mem.params, mem.grads, mem.optimizer, mem.activations, mem.buffers)
        table.add_row(
            "*" if i == result.chosen else str(i),
            cand.describe() + (" (planner only)" if cand.planner_only else ""),
            *(_gib(x) for x in by_category[: len(categories)]),
            _gib(mem.total) + ("" if cand.fits else " !"),
            *((_gib(mem.host),) if host else ()),
            format_seconds(t.step_seconds),
            f"{t.tokens_per_sec:,.0f}",
            "-" if t.mfu is None else f"{t.mfu:.1%}",
            f"{t.comm_compute_ratio:.2f}",
            f"{t.bubble_fraction:.1%}",
        )
    console.print(table)
    console.print(LEGEND, highlight=False)
    if result.chosen is not None:
        best = result.best()
        console.print(f"chosen: [bold green]{best.describe()}[/]", highlight=False)
        console.print(batch_line(best), highlight=False)
        shape = model.to_model_args() if hasattr(model, "to_model_args") else model
        for line in stage_lines(best, hardware, shape.n_layers):
            console.print(line, highlight=False)
        command = train_command(overrides, best)
        console.print(f"run it: {_wrapped(command)}", highlight=False, soft_wrap=True)
        console.print("(the command of row N: --command N; of every row: --command all)")
        if hardware.accelerator == "gpu":
            console.print(prediction_line(best), highlight=False)
        for line in slow_link_advice(
            shape,
            hardware,
            best,
            evaluate=lambda settings: evaluate(
                shape, hardware, best.layout, settings, headroom=DEFAULT_HEADROOM
            ),
        ):
            console.print(line, highlight=False)
    if result.rejected:
        n = len(result.rejected)
        console.print(f"{n} {'family' if n == 1 else 'families'} rejected, e.g.:")
        for item in result.rejected[:5]:
            console.print(f"  {item['family']}: {item['reason']}", highlight=False)


def _sig3(x: float) -> float:
    """`x` to three significant digits (a band is no more precise)."""
    return float(f"{x:.3g}")


def prediction_line(candidate) -> str:
    """The chosen row's tokens/s, step time and MFU, each with its likely range: the 10th to
    90th percentile of the time model's leave-one-source-out errors on published runs
    (`published.holdout.prediction_band`; docs/PLANNER.md, "Uncertainty")."""
    from lightning_dist.published.holdout import prediction_band

    t = candidate.time
    low, high = prediction_band(t.tokens_per_sec)
    line = (
        f"predicted: tokens/s {t.tokens_per_sec:,.0f}, likely {_sig3(low):,.0f}-"
        f"{_sig3(high):,.0f}; step "
        f"{format_seconds(t.step_seconds)}, likely "
        f"{format_seconds(t.step_seconds * t.tokens_per_sec / high)}-"
        f"{format_seconds(t.step_seconds * t.tokens_per_sec / low)}"
    )
    if t.mfu is not None:
        scale = t.mfu / t.tokens_per_sec
        line += f"; MFU {t.mfu:.1%}, likely {low * scale:.1%}-{high * scale:.1%}"
    return line + " (10th-90th percentile of the errors on published runs left out of the fit)"
