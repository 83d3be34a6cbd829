"""llm-foundry's published MPT throughput as calibration rows: a second source of end-to-end
runs beside torchtitan's and Megatron-LM's (`python -m lightning_dist.calibration_report`).

The table is `scripts/train/benchmarking/README.md` in mosaicml/llm-foundry (commit 061f2c7 of
2023-10-17; the rows are unchanged at 8c8dd48 of 2025-07-21),
sections "H100 80GB BF16" and "A100 80GB with 1600 Gbps node-node interconnect (RoCE)": MPT
models trained with Composer's FSDP (FULL_SHARD over every GPU), flash attention, bf16 autocast
(MP mode DEFAULT: bf16 parameters, fp32 gradient reduction) or pure bf16 (MP mode PURE),
activation checkpointing of every block or none, on the MosaicML platform. The rows kept: the
7B to 70B models at each sequence length the table has for them on 8 GPUs, plus the multi-node
ones. Their column "Throughput (T/s/GPU)" is the measured value.

The model: MPT's blocks as those benchmarks ran them (the same commit's
`scripts/train/benchmarking/submit_benchmarks.py`, the pretrain yamls and MPT's config
defaults): LayerNorm in bf16 (`low_precision_layernorm`), a GELU MLP of 4 d, biases, learned
positions (no ALiBi), the Triton FlashAttention kernel (`attn_impl: triton`), tied embeddings
and a vocabulary of 50,368. The planner takes it as our SwiGLU of width 8d/3 (the same
parameters and FLOPs: `planner/megatron.gpt_model_args`) with MPT's own pointwise ops
(`block_ops="mpt"`: `planner/compute.POINTWISE_BYTES`). The shapes (d_model, n_layers, n_heads,
vocab_size) are those of `scripts/train/yamls/pretrain/mpt-{7b,13b,30b,70b}.yaml`; 12 d^2 L +
V d matches the table's NumParams column within 0.2% for each size. What the planner does not
know: Composer's FSDP1 (we predict with FSDP2's overlap), the Triton kernel's speed (its only
published figures cannot be what ran; FlashAttention-2's are used: docs/PLANNER.md,
"llm-foundry, and leave-one-source-out"), and the H100s' power limit (the platform's SXM
parts, assumed at 700 W).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightning_dist.layout import Layout
from lightning_dist.models.args import ModelArgs
from lightning_dist.planner.estimate import estimate

FOUNDRY = (
    "mosaicml/llm-foundry scripts/train/benchmarking/README.md (llm-foundry "
    "061f2c7ce64e655100286584a7629e2a09f827ba)"
)
MPT_SHAPES = {
    "7b": (4096, 32, 32),
    "13b": (5120, 40, 40),
    "30b": (7168, 48, 56),
    "70b": (8192, 80, 64),
}
"""(d_model, n_layers, n_heads) of each MPT size."""
MPT_VOCAB = 50368
H100_TABLE, A100_TABLE = "H100 80GB BF16", "A100 80GB with 1600 Gbps node-node interconnect (RoCE)"


@dataclass(frozen=True)
class FoundryRun:
    """One row of the table: model, sequence, GPUs, micro-batch, accumulation, global batch,
    tokens/s per GPU, precision (amp_bf16 or bf16), activation checkpointing, section."""

    model: str
    seq_len: int
    gpus: int
    micro_batch: int
    grad_accum: int
    global_batch: int
    tokens_per_gpu: float
    pure_bf16: bool
    checkpointing: bool
    table: str

    @property
    def label(self) -> str:
        gpu = "H100" if self.table == H100_TABLE else "A100"
        return f"MPT-{self.model} {gpu} x{self.gpus} s={self.seq_len}"


def _run(model, seq, gpus, mbs, accum, gbs, tokens, precision, ac, table) -> FoundryRun:
    return FoundryRun(model, seq, gpus, mbs, accum, gbs, tokens, precision == "bf16", ac, table)


H, A = H100_TABLE, A100_TABLE
FOUNDRY_RUNS = (
    _run("70b", 2048, 64, 8, 4, 2048, 1039, "amp_bf16", True, H),
    _run("30b", 8192, 8, 1, 21, 168, 1384, "amp_bf16", True, H),
    _run("30b", 2048, 32, 14, 3, 1344, 2308, "amp_bf16", True, H),
    _run("13b", 32768, 8, 1, 3, 24, 1976, "amp_bf16", True, H),
    _run("13b", 4096, 8, 10, 3, 240, 4717, "amp_bf16", True, H),
    _run("13b", 2048, 64, 2, 1, 128, 4800, "amp_bf16", False, H),
    _run("7b", 32768, 8, 2, 2, 32, 3318, "amp_bf16", True, H),
    _run("7b", 8192, 8, 8, 2, 128, 6935, "amp_bf16", True, H),
    _run("7b", 2048, 8, 6, 1, 48, 10643, "amp_bf16", False, H),
    _run("70b", 2048, 64, 8, 4, 2048, 410, "bf16", True, A),
    _run("30b", 2048, 8, 3, 21, 504, 916, "amp_bf16", True, A),
    _run("13b", 8192, 8, 5, 3, 120, 1795, "amp_bf16", True, A),
    _run("13b", 2048, 8, 2, 3, 48, 2262, "amp_bf16", False, A),
    _run("7b", 32768, 8, 2, 2, 32, 1672, "amp_bf16", True, A),
    _run("7b", 2048, 8, 6, 2, 96, 4641, "amp_bf16", False, A),
)  # fmt: skip
"""The rows, transcribed from the table (columns Model, SeqLen, # GPUs, MicroBatchSize,
GradAccum, GlobalBatchSize, Throughput (T/s/GPU), Precision, Activation Checkpointing)."""


def mpt_model(size: str, seq_len: int) -> ModelArgs:
    """MPT-`size` in the planner's terms (see the module docstring)."""
    d, layers, heads = MPT_SHAPES[size]
    return ModelArgs(
        dim=d,
        n_layers=layers,
        n_heads=heads,
        vocab_size=MPT_VOCAB,
        ffn_hidden_size=64 * round(8 * d / 3 / 64),
        max_seq_len=seq_len,
        tie_embeddings=True,
    )


def foundry_hardware_overrides(run: FoundryRun) -> list[str]:
    """conf/hardware overrides of the run's machine: dgx_h100 or dgx_a100 (whose 25 GB/s per
    GPU across nodes is the table's 1600 Gbps per node), `gpus / 8` nodes."""
    name = "dgx_h100" if run.table == H100_TABLE else "dgx_a100"
    return [f"hardware={name}", f"hardware.num_nodes={run.gpus // 8}"]


def foundry_candidate(run: FoundryRun, hardware):
    """The planner's estimate of the run on `hardware` (a HardwareSpec of its machine)."""
    dtypes: dict[str, Any] = (
        {} if run.pure_bf16 else {"param_dtype": "bf16", "reduce_dtype": "fp32"}
    )
    return estimate(
        mpt_model(run.model, run.seq_len),
        hardware,
        Layout(dp_shard=run.gpus),
        global_batch_size=run.global_batch,
        seq_len=run.seq_len,
        micro_batch_size=run.micro_batch,
        sharding="FULL_SHARD",
        precision="bf16-true" if run.pure_bf16 else "bf16-mixed",
        activation_checkpointing="full" if run.checkpointing else 0,
        block_ops="mpt",
        **dtypes,
    )
