"""`python -m lightning_dist.calibration_report [--write] [--megatron]`: the planner against every row of
its calibration (lightning_dist/planner/calibration.json): predicted, measured or published,
error, and whether the row meets its target (`calibration.TARGETS`).

The published runs, predicted here by the current planner:

- **torchtitan, Llama 3.1 8B on H100** (`benchmarks/llama3_h100_202412_torchtitan.md` in
  pytorch/torchtitan, December 2024, Tables 1 and 3): FSDP on 8 and 128 GPUs, local batch 2,
  sequence 8192, selective (op) activation checkpointing, with and without torch.compile, and
  compiled with float8 (tensorwise, the float8 all-gather assumed on: torchtitan's float8 docs
  of the time recommend it; the benchmark does not say);
  tokens per second per GPU and memory per GPU (torchtitan logs the CUDA caching allocator's
  peak reserved memory). The GPUs are H100 SXM with 96 GB of HBM2e (2.4 TB/s) at a 500 W power
  limit, "between SXM and NVL" in peak FLOP/s: `hardware=dgx_h100 hardware.memory_gib=96
  hardware.memory_gbytes_per_sec=2400`, the SXM peak of 989 TFLOP/s as the datasheet figure,
  and the lower clocks of the 500 W limit in dgx_h100's `matmul_efficiency` (fitted to these
  rows; conservative for a 700 W part). torchtitan's op policy recomputes every other matmul
  where ours keeps them all; ours is what the planner predicts.
- **Megatron-LM Table 1** (Narayanan et al., SC 2021; planner/megatron.py): GPT models from
  1.7B to 1T on DGX A100 80 GB, as the percentage of peak the paper reports (its FLOPs count
  the recomputed forward: `time.hfu`), predicted for the published layout (best schedule and
  micro-batch) with the math attention path of 2021 (no flash attention).

`published_rows()` gives them as calibration rows with the current planner's predictions;
`--write` stores those in calibration.json (a test checks that the stored ones are current);
`--megatron` prints the Megatron comparison as docs/PLANNER.md's table. A top-level module like
`lightning_dist.plan`: it composes conf/ (the hardware files), which the planner may not.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_dist.hardware import HardwareSpec
from lightning_dist.layout import Layout
from lightning_dist.planner.calibration import (
    TARGETS,
    CalibrationRow,
    _stored,
    row_error,
    save,
    table,
)
from lightning_dist.planner.estimate import estimate

TORCHTITAN = (
    "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (torchtitan 9dec370, "
    "2024-12-26)"
)
MEGATRON = "Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters " \
    "Using Megatron-LM, SC 2021, Table 1"  # fmt: skip


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
    from lightning_dist.config import compose_config, hardware_spec

    return hardware_spec(compose_config([*overrides, "paths.output_dir=."]))


def torchtitan_hardware(nodes: int) -> HardwareSpec:
    """conf/hardware/dgx_h100.yaml with the benchmark's 96 GB of HBM2e at 2.4 TB/s."""
    return hardware(["hardware=dgx_h100", f"hardware.num_nodes={nodes}",
                     "hardware.memory_gib=96", "hardware.memory_gbytes_per_sec=2400"])  # fmt: skip


def torchtitan_overrides(run: TorchtitanRun) -> list[str]:
    """train.py overrides of the run `torchtitan_candidate` predicts (stored with its rows)."""
    return [
        "model=llama3_8b", "hardware=dgx_h100", f"hardware.num_nodes={run.gpus // 8}",
        "hardware.memory_gib=96", "hardware.memory_gbytes_per_sec=2400", "strategy=fsdp2",
        "strategy.dp_replicate=1",  # FSDP over every GPU (fsdp2 replicates per node otherwise)
        f"data.global_batch_size={2 * run.gpus}", "data.seq_len=8192",
        "data.micro_batch_size=2", "strategy.activation_checkpointing=op",
        f"strategy.compile={str(run.compile).lower()}",
        *(["strategy.float8=tensorwise", "strategy.float8_all_gather=true"] if run.float8 else []),
    ]  # fmt: skip


def torchtitan_candidate(run: TorchtitanRun):
    from lightning_dist.config import compose_config, model_spec

    model = model_spec(compose_config(["model=llama3_8b", "paths.output_dir=."]))
    return estimate(
        model, torchtitan_hardware(run.gpus // 8), Layout(dp_shard=run.gpus),
        global_batch_size=2 * run.gpus, seq_len=8192, micro_batch_size=2,
        activation_checkpointing="op", compile=run.compile,
        float8="tensorwise" if run.float8 else "none", float8_all_gather=run.float8,
    )  # fmt: skip


def torchtitan_rows() -> list[CalibrationRow]:
    rows = []
    for run in TORCHTITAN_RUNS:
        c = torchtitan_candidate(run)
        label = f"fsdp {run.gpus}" + (" compile" if run.compile else "") + (
            " float8" if run.float8 else "")  # fmt: skip
        common = dict(
            source="published", model="Llama 3.1 8B", hardware="H100 96GB HBM2e 500W",
            layout=label, overrides=tuple(torchtitan_overrides(run)),
            planner_layout=c.describe(), precision="bf16-mixed", seq_len=8192,
            global_batch_size=2 * run.gpus, origin=f"{TORCHTITAN}, Table {run.table}",
            date="2024-12-26",
        )  # fmt: skip
        rows.append(CalibrationRow(
            quantity="time.tokens_per_sec_per_device", measured=run.tokens_per_gpu,
            predicted=c.time.tokens_per_sec / run.gpus, **common,
        ))  # fmt: skip
        rows.append(CalibrationRow(
            quantity="memory.process_bytes", measured=run.memory_gib * 2**30,
            predicted=c.memory.total, notes="torchtitan's peak reserved memory", **common,
        ))  # fmt: skip
    return rows


def megatron_rows() -> list[CalibrationRow]:
    from lightning_dist.planner.megatron import TABLE1, compare_row

    node = hardware(["hardware=dgx_a100"])
    rows = []
    for row in TABLE1:
        result = compare_row(row, node)
        rows.append(CalibrationRow(
            source="published", quantity="time.hfu", measured=row.percent_of_peak / 100,
            predicted=result["paper_percent"] / 100 if result["fits"] else None,
            model=f"GPT {row.billions:g}B", hardware="DGX A100 80GB",
            layout=f"tp {row.tp} x pp {row.pp} x dp {row.gpus // (row.tp * row.pp)}",
            planner_layout=result.get("label", ""), precision="bf16-mixed", seq_len=2048,
            global_batch_size=row.batch, origin=MEGATRON, date="2021-11-14",
            notes="the paper's FLOPs count the recomputed forward",
        ))  # fmt: skip
    return rows


def published_rows() -> list[CalibrationRow]:
    """Every published row, with the current planner's prediction."""
    return torchtitan_rows() + megatron_rows()


def main(argv: list[str] | None = None) -> int:
    """The planner against every calibration row, with its error."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lightning_dist.calibration_report",
                                     description=main.__doc__)  # fmt: skip
    parser.add_argument("--write", action="store_true", help="store the published rows' "
                        "current predictions in calibration.json")  # fmt: skip
    parser.add_argument("--megatron", action="store_true", help="print the Megatron-LM "
                        "Table 1 comparison of docs/PLANNER.md instead")  # fmt: skip
    args = parser.parse_args(argv)
    if args.megatron:
        from lightning_dist.planner.megatron import TABLE1, compare_row, markdown

        node = hardware(["hardware=dgx_a100"])
        results = [compare_row(row, node) for row in TABLE1]
        print(markdown(results))
        for r in results:
            print(f"{r['row'].billions:g}B: published layout as {r['label']}; "
                  f"planner's choice {r['chosen']}")  # fmt: skip
        return 0
    live = published_rows()
    stored = _stored()
    if args.write:
        save(stored.with_rows(live))
        stored = _stored()
    others = [r for r in stored.rows if r.source != "published"]
    print(table(others + live))
    missed = [
        r for r in live
        if (t := TARGETS.get((r.source, r.quantity))) is not None
        and (e := row_error(r)) is not None and abs(e) > t
    ]  # fmt: skip
    print(f"\n{len(live)} published rows, {len(live) - len(missed)} within their targets"
          + (f"; missed: {', '.join(f'{r.layout} {r.quantity}' for r in missed)}" if missed else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
