"""The published runs the planner is checked against, as calibration rows with the current
planner's predictions: torchtitan's Llama 3.1 8B H100 benchmark, Megatron-LM's Table 1, llm-foundry's
MPT table (`foundry.py`) and the held-out runs (`HELD_OUT`); `python -m
lightning_dist.calibration_report` prints them. It composes `lightning_dist/conf/` (the hardware
files), which the planner may not, so it lives on a floor of its own above `planner/`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from lightning_dist.hardware import HardwareSpec
from lightning_dist.layout import Layout
from lightning_dist.planner.calibration import (
    CalibrationRow,
)
from lightning_dist.planner.estimate import estimate

TORCHTITAN = (
    "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (torchtitan 9dec370, "
    "2024-12-26)"
)
MEGATRON = (
    "Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters "
    "Using Megatron-LM, SC 2021, Table 1"
)


@dataclass(frozen=True)
class TorchtitanRun:
    table: int
    gpus: int
    compile: bool
    tokens_per_gpu: float
    memory_gib: float
    float8: bool = False
    """"FSDP + torch.compile + Float8": tensorwise float8 linears with the float8 all-gather
    (torchtitan's docs/float8.md of the time recommends `enable_fsdp_float8_all_gather`; the
    benchmark does not say, so this is an assumption)."""


TORCHTITAN_RUNS = (
    TorchtitanRun(1, 8, False, 5762, 82.4),
    TorchtitanRun(1, 8, True, 6667, 77.0),
    TorchtitanRun(1, 8, True, 8532, 76.8, float8=True),
    TorchtitanRun(3, 128, False, 5605, 67.0),
    TorchtitanRun(3, 128, True, 6514, 62.0),
    TorchtitanRun(3, 128, True, 8380, 61.8, float8=True),
)


def hardware(overrides: list[str]) -> HardwareSpec:
    """The HardwareSpec of conf/ with `overrides` (hardware=..., hardware.<field>=...)."""
    return _composed_hardware(tuple(overrides))


@functools.lru_cache(maxsize=64)
def _composed_hardware(overrides: tuple[str, ...]) -> HardwareSpec:
    """`hardware`, composed once per override set (a fit predicts every row many times)."""
    from lightning_dist.config import compose_config, hardware_spec

    return hardware_spec(compose_config([*overrides, "paths.output_dir=."]))


@functools.lru_cache(maxsize=8)
def config_model(name: str):
    """The ModelArgs of conf/model/<name>.yaml, composed once."""
    from lightning_dist.config import compose_config, model_spec

    return model_spec(compose_config([f"model={name}", "paths.output_dir=."]))


def torchtitan_hardware(nodes: int) -> HardwareSpec:
    """conf/hardware/dgx_h100.yaml with the benchmark's 96 GB of HBM2e at 2.4 TB/s."""
    return hardware(
        [
            "hardware=dgx_h100",
            f"hardware.num_nodes={nodes}",
            "hardware.memory_gib=96",
            "hardware.memory_gbytes_per_sec=2400",
            "hardware.power_w=500",
        ]
    )


def torchtitan_overrides(run: TorchtitanRun) -> list[str]:
    """train.py overrides of the run `torchtitan_candidate` predicts (stored with its rows)."""
    return [
        "model=llama3_8b", "hardware=dgx_h100", f"hardware.num_nodes={run.gpus // 8}",
        "hardware.memory_gib=96", "hardware.memory_gbytes_per_sec=2400", "hardware.power_w=500",
        "strategy=fsdp2",
        "strategy.dp_replicate=1",  # FSDP over every GPU (fsdp2 replicates per node otherwise)
        f"data.global_batch_size={2 * run.gpus}", "data.seq_len=8192",
        "data.micro_batch_size=2", "strategy.activation_checkpointing=op_alternate",
        f"strategy.compile={str(run.compile).lower()}",
        *(["strategy.float8=tensorwise", "strategy.float8_all_gather=true"] if run.float8 else []),
    ]  # fmt: skip


def torchtitan_label(run: TorchtitanRun) -> str:
    """The row's layout name: 'fsdp 8 compile float8'."""
    return (
        f"fsdp {run.gpus}" + (" compile" if run.compile else "") + (" float8" if run.float8 else "")
    )


def torchtitan_candidate(run: TorchtitanRun, spec: HardwareSpec | None = None):
    """The planner's estimate of the run on `spec` (default `torchtitan_hardware`). The loss
    is eager: torchtitan 9dec370 left `torch.compile(loss_fn)` commented out (train.py)."""
    model = config_model("llama3_8b")
    return estimate(
        model,
        spec or torchtitan_hardware(run.gpus // 8),
        Layout(dp_shard=run.gpus),
        global_batch_size=2 * run.gpus,
        seq_len=8192,
        micro_batch_size=2,
        activation_checkpointing="op_alternate",
        compile=run.compile,
        float8="tensorwise" if run.float8 else "none",
        float8_all_gather=run.float8,
    )


def torchtitan_rows() -> list[CalibrationRow]:
    rows = []
    for run in TORCHTITAN_RUNS:
        c = torchtitan_candidate(run)
        label = torchtitan_label(run)
        common = dict(
            source="published",
            model="Llama 3.1 8B",
            hardware="H100 96GB HBM2e 500W",
            layout=label,
            overrides=tuple(torchtitan_overrides(run)),
            planner_layout=c.describe(),
            precision="bf16-mixed",
            seq_len=8192,
            global_batch_size=2 * run.gpus,
            origin=f"{TORCHTITAN}, Table {run.table}",
            date="2024-12-26",
        )
        rows.append(
            CalibrationRow(
                quantity="time.tokens_per_sec_per_device",
                measured=run.tokens_per_gpu,
                predicted=c.time.tokens_per_sec / run.gpus,
                **common,
            )
        )
        rows.append(
            CalibrationRow(
                quantity="memory.reserved_bytes",
                measured=run.memory_gib * 2**30,
                predicted=c.memory.reserved,
                notes="torchtitan logs the peak reserved memory",
                **common,
            )
        )
    return rows


def megatron_rows() -> list[CalibrationRow]:
    from lightning_dist.planner.megatron import TABLE1, compare_row

    node = hardware(["hardware=dgx_a100"])
    rows = []
    for row in TABLE1:
        result = compare_row(row, node)
        rows.append(
            CalibrationRow(
                source="published",
                quantity="time.hfu",
                measured=row.percent_of_peak / 100,
                predicted=result["paper_percent"] / 100 if result["fits"] else None,
                model=f"GPT {row.billions:g}B",
                hardware="DGX A100 80GB",
                layout=f"tp {row.tp} x pp {row.pp} x dp {row.gpus // (row.tp * row.pp)}",
                planner_layout=result.get("label", ""),
                precision="bf16-mixed",
                seq_len=2048,
                global_batch_size=row.batch,
                origin=MEGATRON,
                date="2021-11-14",
                notes="the paper's FLOPs count the recomputed forward",
            )
        )
    return rows


def foundry_rows() -> list[CalibrationRow]:
    """llm-foundry's MPT rows (`published/foundry.py`): tokens/s per GPU."""
    from lightning_dist.published.foundry import (
        FOUNDRY,
        FOUNDRY_RUNS,
        foundry_candidate,
        foundry_hardware_overrides,
        mpt_model,
    )

    rows = []
    for run in FOUNDRY_RUNS:
        overrides = foundry_hardware_overrides(run)
        c = foundry_candidate(run, hardware(overrides))
        rows.append(
            CalibrationRow(
                source="published",
                quantity="time.tokens_per_sec_per_device",
                measured=run.tokens_per_gpu,
                predicted=c.time.tokens_per_sec / run.gpus,
                model=f"MPT-{run.model} ({mpt_model(run.model, run.seq_len).num_params() / 1e9:.1f}B)",
                hardware=overrides[0].partition("=")[2],
                layout=run.label,
                planner_layout=c.describe(),
                precision=c.settings.precision,
                seq_len=run.seq_len,
                global_batch_size=run.global_batch,
                origin=f"{FOUNDRY}, {run.table}",
                date="2023-10-17",
                notes="fsdp FULL_SHARD over every GPU, flash attention",
            )
        )
    return rows


def published_rows() -> list[CalibrationRow]:
    """Every published row, with the current planner's prediction."""
    return torchtitan_rows() + megatron_rows() + foundry_rows()


@dataclass(frozen=True)
class HeldOutRun:
    """A published run no constant was fitted to, predicted to see how the model carries."""

    label: str
    model: str
    hardware: tuple[str, ...]
    layout: Layout
    knobs: dict
    tokens_per_gpu: float
    memory_gib: float | None
    origin: str
    notes: str = ""


_TT = "compile, float8 tensorwise with the float8 all-gather (assumed)"
_F8 = dict(compile=True, float8="tensorwise", float8_all_gather=True)
_H100 = (
    "hardware=dgx_h100",
    "hardware.memory_gib=96",
    "hardware.memory_gbytes_per_sec=2400",
    "hardware.power_w=500",
)
HELD_OUT = (
    HeldOutRun("8B fsdp 8, 32k tokens", "llama3_8b", (*_H100, "hardware.num_nodes=1"),
               Layout(dp_shard=8), dict(global_batch_size=8, seq_len=32768, micro_batch_size=1,
               activation_checkpointing="full", **_F8), 3890, 83.9, f"{TORCHTITAN}, Table 2",
               f"local batch 1, full AC, {_TT}; the CP rows of the table use ring attention"),
    HeldOutRun("70B fsdp 32 x tp 8", "llama3_70b", (*_H100, "hardware.num_nodes=32"),
               Layout(dp_shard=32, tp=8), dict(global_batch_size=512, seq_len=8192,
               micro_batch_size=16, activation_checkpointing="full", **_F8), 829, 71.9,
               f"{TORCHTITAN}, Table 4", f"local batch 16, full AC, {_TT}"),
    HeldOutRun("405B fsdp 8 x tp 8 x pp 8 1F1B", "llama3_405b", (*_H100, "hardware.num_nodes=64"),
               Layout(dp_shard=8, tp=8, pp=8, microbatches=8), dict(global_batch_size=256,
               seq_len=8192, micro_batch_size=4, activation_checkpointing="full", **_F8), 100,
               82.5, f"{TORCHTITAN}, Table 5",
               f"local batch 32 in 8 microbatches (torchtitan's default: one per stage), {_TT}"),
    HeldOutRun("405B fsdp 8 x tp 8 x pp 8 interleaved", "llama3_405b",
               (*_H100, "hardware.num_nodes=64"), Layout(dp_shard=8, tp=8, pp=8,
               schedule="Interleaved1F1B", virtual_stages=2, microbatches=8),
               dict(global_batch_size=256, seq_len=8192, micro_batch_size=4,
               activation_checkpointing="full", **_F8), 128, 72.7, f"{TORCHTITAN}, Table 5",
               f"two stages per rank and 8 microbatches (torchtitan 9dec370's defaults: "
               f"pipelining_utils.py), {_TT}"),
    HeldOutRun("70B fsdp 32 x tp 8 bf16", "llama3_70b", (*_H100, "hardware.num_nodes=32"),
               Layout(dp_shard=32, tp=8), dict(global_batch_size=512, seq_len=8192,
               micro_batch_size=16, activation_checkpointing="full", compile=True), 597.3, None,
               "pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md",
               "vanilla TP, local batch 16, full AC, compile"),
    HeldOutRun("8B fsdp 8 x tp 8 bf16", "llama3_8b", (*_H100, "hardware.num_nodes=8"),
               Layout(dp_shard=8, tp=8), dict(global_batch_size=96, seq_len=8192,
               micro_batch_size=12, activation_checkpointing="op_alternate", compile=True),
               4378, None, "pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md",
               "vanilla TP, local batch 12, torchtitan's op policy, compile"),
    HeldOutRun("8B fsdp 32 on H200", "llama3_8b", ("hardware=dgx_h200", "hardware.num_nodes=4"),
               Layout(dp_shard=32), dict(global_batch_size=64, seq_len=8192, micro_batch_size=2,
               activation_checkpointing="op_alternate", loss="compiled", **_F8), 10938, 47.96,
               "pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md",
               "700 W H200s (dgx_h200 takes the H100's efficiency at 700 W); torchtitan e7c0cae "
               "(the run's) compiles its loss under --training.compile "
               "(torchtitan/components/loss.py), so its memory counts the compiled loss; "
               "llama3_8b.toml there: seq_len 8192, selective op AC"),
)  # fmt: skip
"""Published runs held out of every fit: the rest of torchtitan's H100 benchmark, its async-TP
benchmark (vanilla TP) and Trainy's H200 run. Their assumptions are in `notes`."""


def held_out_rows() -> list[CalibrationRow]:
    """The held-out runs as rows with the current planner's prediction (not stored)."""
    from lightning_dist.config import compose_config, model_spec

    rows = []
    for run in HELD_OUT:
        model = model_spec(compose_config([f"model={run.model}", "paths.output_dir=."]))
        spec = hardware(list(run.hardware))
        c = estimate(model, spec, run.layout, **run.knobs)
        common = dict(
            source="published",
            model=run.model,
            hardware=spec.name,
            layout=run.label,
            planner_layout=c.describe(),
            precision="bf16-mixed",
            seq_len=run.knobs["seq_len"],
            global_batch_size=run.knobs["global_batch_size"],
            origin=run.origin,
            date="2025-06-13",
            notes=f"held out: {run.notes}",
        )
        rows.append(
            CalibrationRow(
                quantity="time.tokens_per_sec_per_device",
                measured=run.tokens_per_gpu,
                predicted=c.time.tokens_per_sec / spec.world_size,
                **common,
            )
        )
        if run.memory_gib:
            rows.append(
                CalibrationRow(
                    quantity="memory.reserved_bytes",
                    measured=run.memory_gib * 2**30,
                    predicted=c.memory.reserved,
                    **common,
                )
            )
    return rows
