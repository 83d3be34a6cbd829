"""The planner against a published weak-scaling table: Megatron-LM, Table 1 of Narayanan et al.,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC 2021).

GPT models from 1.7B to 1T parameters (vocabulary 51,200, sequence 2,048) trained on DGX A100
(80 GB) nodes with tensor (tp) and pipeline (pp) parallelism, plain data parallelism over the
rest, and activation recomputation. The rows below were transcribed by hand from the paper.

`python -m lightning_dist.calibration_report --megatron` prints the comparison as a markdown table
(docs/PLANNER.md, "Megatron Table 1"); its rows are published calibration rows
(`python -m lightning_dist.calibration_report`).

The paper's "percentage of theoretical peak" counts the FLOPs of the recomputed forward too
(its formula 96 B s l h^2 (1 + s/6h + V/16lh) is 4 passes of 24 B s l h^2), so the planner's
number compared with it is `paper_percent`: that formula over the planner's step time, not the
planner's MFU (which counts 3 passes and leaves recomputation out).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lightning_dist.layout import Layout
from lightning_dist.models.args import ModelArgs
from lightning_dist.planner.estimate import estimate
from lightning_dist.planner.search import plan_layouts

VOCAB, SEQ_LEN = 51_200, 2_048
A100_PEAK_BF16 = 312e12


@dataclass(frozen=True)
class PublishedRow:
    """One row of the paper's Table 1."""

    billions: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops_per_gpu: float
    percent_of_peak: float


TABLE1 = (
    PublishedRow(1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44),
    PublishedRow(3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44),
    PublishedRow(7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46),
    PublishedRow(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43),
    PublishedRow(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44),
    PublishedRow(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45),
    PublishedRow(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47),
    PublishedRow(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50),
    PublishedRow(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52),
    PublishedRow(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52),
)


def gpt_model_args(hidden: int, layers: int, heads: int) -> ModelArgs:
    """A GPT (GELU MLP of width 4h, tied embeddings) in the planner's terms.

    The planner describes a SwiGLU MLP (3 matrices of h x ffn); a width of 8h/3, rounded to a
    multiple of 64 so tp=8 divides it, gives the same 8h^2 parameters and FLOPs as GPT's two
    h x 4h matrices (within 0.1%). What it does not describe: learned position embeddings
    (s x h parameters, < 0.2% of the smallest model), LayerNorm biases, and the GELU MLP's
    activation memory (one 4h tensor where SwiGLU keeps three of 8h/3).
    """
    return ModelArgs(
        dim=hidden,
        n_layers=layers,
        n_heads=heads,
        vocab_size=VOCAB,
        ffn_hidden_size=64 * round(8 * hidden / 3 / 64),
        max_seq_len=SEQ_LEN,
        tie_embeddings=True,
    )


def paper_flops_per_step(row: PublishedRow) -> float:
    """The paper's FLOPs per iteration, recomputation included (its Eq. 3)."""
    b, s, h, n = row.batch, SEQ_LEN, row.hidden, row.layers
    return 96 * b * s * n * h * h * (1 + s / (6 * h) + VOCAB / (16 * n * h))


def compare_row(row: PublishedRow, node, *, rank: bool = True) -> dict:
    """The planner on one row, on `node` (the HardwareSpec of one DGX A100 node,
    conf/hardware/dgx_a100.yaml) times the row's nodes, with Megatron's feature set: no ZeRO sharding, activation
    recomputation, 1F1B or interleaved schedules. Returns the published layout's best fitting
    variant (schedule x micro-batch size), its rank among the planner's layouts (0 = chosen;
    with `rank=False` no search runs and rank and chosen are None: a fit's many calls), and
    both utilisation figures."""
    model = gpt_model_args(row.hidden, row.layers, row.heads)
    hardware = replace(node, num_nodes=row.gpus // 8)
    plan = None
    if rank:
        plan = plan_layouts(
            model,
            hardware,
            global_batch_size=row.batch,
            seq_len=SEQ_LEN,
            sharding_modes=("NO_SHARD",),
            activation_checkpointing=True,
            attention="math",
        )
    ranks = [
        i
        for i, c in enumerate(plan.candidates if plan else [])
        if (c.layout.tp, c.layout.pp) == (row.tp, row.pp)
    ]
    dp = row.gpus // (row.tp * row.pp)
    best = None
    for schedule in ("1F1B", "Interleaved1F1B") if row.pp > 1 else ("1F1B",):
        layout = Layout(
            tp=row.tp,
            pp=row.pp,
            dp_replicate=dp,
            schedule=schedule,
            virtual_stages=2 if schedule == "Interleaved1F1B" else 1,
        )
        for mbs in (1, 2, 4):
            try:
                c = estimate(
                    model,
                    hardware,
                    layout,
                    global_batch_size=row.batch,
                    seq_len=SEQ_LEN,
                    activation_checkpointing=True,
                    micro_batch_size=mbs,
                    sharding="NO_SHARD",
                    attention="math",
                )
            except ValueError:  # e.g. interleaving needs microbatches divisible by pp
                continue
            if c.fits and (best is None or c.time.step_seconds < best.time.step_seconds):
                best = c
    result = {"row": row, "rank": ranks[0] if ranks else None, "fits": best is not None}
    if best is not None:
        paper_percent = 100 * paper_flops_per_step(row) / best.time.step_seconds
        paper_percent /= row.gpus * A100_PEAK_BF16
        result.update(
            label=best.describe(),
            memory_gib=best.memory.total / 2**30,
            mfu_percent=100 * best.time.mfu,
            paper_percent=paper_percent,
            bubble=best.time.bubble_fraction,
            chosen=plan.best().describe() if plan else None,
        )
    return result


def markdown(results: list[dict]) -> str:
    """The comparison as the table in docs/PLANNER.md."""
    lines = [
        "| model | heads | hidden | layers | tp | pp | GPUs | batch | published TFLOP/s, % peak "
        "| planner: fits, GiB | rank | planner % peak (paper's FLOPs) | planner MFU % | gap |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        row = r["row"]
        fit = f"yes, {r['memory_gib']:.1f}" if r["fits"] else "no"
        lines.append(
            f"| {row.billions:g}B | {row.heads} | {row.hidden} | {row.layers} | {row.tp} | "
            f"{row.pp} | {row.gpus} | {row.batch} | {row.tflops_per_gpu:g}, {row.percent_of_peak:g}% "
            f"| {fit} | {r['rank']} | {r['paper_percent']:.1f} | {r['mfu_percent']:.1f} | "
            f"{r['paper_percent'] - row.percent_of_peak:+.1f} |"
        )
    return "\n".join(lines)
