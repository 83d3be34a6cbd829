"""Rank worker of tests/dist/test_activation_memory_dist.py; run it with `torchrun --nproc-per-node 2`.

With the chunked loss (so the logits are not in the way), it measures with MemTracker
(`measure_step`) the activations of one training step of llama_debug-shaped models with 2 and
4 blocks: their difference over 2 blocks and the tokens is the activation bytes per token and
block (`table`: one process and tp=2 with sequence and loss parallelism, fp32 and bf16-mixed,
no / op / full checkpointing; bench/activation_memory.py prints it). It also records the tp=2
step's losses and one process's, for the parity check. Rank 0 writes a JSON to argv[1].
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor.parallel import loss_parallel

from lightning_dist.layout import Layout
from lightning_dist.lm.chunked_loss import chunked_cross_entropy, defer_output_head
from lightning_dist.measure.step_memory import measure_step
from lightning_dist.models.args import ModelArgs
from lightning_dist.parallel.activation_checkpoint import apply_activation_checkpointing
from lightning_dist.parallel.context_parallel import attach_context_parallel, chunk_positions
from lightning_dist.parallel.fsdp import find_block_types
from lightning_dist.parallel.tp import apply_tp

BATCH, SEQ, CHUNK = 4, 128, 256
CP_CHUNK = 32
"""The chunked loss's rows in the context-parallel comparison: one chunk's logits live at a
time whatever the tokens, so a chunk far below a cp rank's 256 tokens keeps that fixed part
from hiding the halving."""


def args(n_layers: int) -> ModelArgs:
    return ModelArgs(
        dim=64,
        n_layers=n_layers,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=512,
        ffn_hidden_size=128,
        max_seq_len=256,
    )


def build(n_layers: int):
    torch.manual_seed(0)
    model = args(n_layers).build()
    return model, defer_output_head(model)


PRECISIONS = ("32-true", "bf16-mixed")
CHECKPOINTING = (0, "op", "full")


def activations_per_block(
    mesh,
    batch,
    checkpointing=0,
    precision="32-true",
    sequence_parallel=True,
    losses=None,
    totals=None,
    cp_mode=None,
    chunk=CHUNK,
) -> float:
    """MemTracker's activations of 4 blocks less 2 blocks, per block and token: TP (with loss
    parallelism, and SP unless turned off) over `mesh`, or one process without a mesh;
    checkpointing applied after TP, as `parallel/parallelize.py` does. Under bf16-mixed the
    bf16 weight copies the linears keep for backward are taken out (they are not activations;
    the planner counts them as buffers): 2 bytes per linear weight of a block without
    checkpointing (a checkpointed block recomputes the casts in backward). Autocast runs
    without its weight cache here, which would otherwise hold the copies through forward
    whatever the checkpointing (under TP, from run to run, 10 to 100 bytes per token and block
    in this shape): weight memory, not activations. With `cp_mode`, `mesh` is a context-parallel
    group instead: each rank runs its head and tail chunks of every sequence in that mode, and
    the tokens counted are its own. `totals` receives the 4-block step's activations."""
    measured = {}
    for n_layers in (2, 4):
        model, head = build(n_layers)
        blocks = find_block_types(model)
        positions = None
        if cp_mode:  # `mesh` is a cp group: this rank's head and tail chunks of every sequence
            attach_context_parallel(model, cp_mode, mesh.get_group())
            positions = chunk_positions(batch.shape[1] - 1, mesh.size(), mesh.get_local_rank())
        elif mesh is not None:
            apply_tp(model, mesh, sequence_parallel=sequence_parallel, loss_parallel=True)
        apply_activation_checkpointing(model, blocks, every_n=checkpointing)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step = step_fn(
            model,
            head,
            opt,
            batch,
            tp=mesh is not None and not cp_mode,
            precision=precision,
            positions=positions,
            chunk=chunk,
        )
        step()
        # The median of three measured steps: one CI run in many saw a row off by one block
        # input; one odd step cannot move it. Always three, on every rank: a third step taken
        # only where one rank's first two differed ran collectives the other rank did not (gloo:
        # "Received data size doesn't match", seen under load).
        samples = sorted(measure_step(step, model, [opt])["activations"] for _ in range(3))
        measured[n_layers] = samples[1]
        if losses is not None and n_layers == 4:
            losses.extend(step.losses[:2])  # the 4-block model's first two steps
    if totals is not None:
        totals.append(measured[4])
    per_block = (measured[4] - measured[2]) / 2
    if precision == "bf16-mixed" and not checkpointing:
        tp = 1 if mesh is None else mesh.size()
        per_block -= 2 * (args(1).block_params() - 2 * args(1).dim) / tp
    tokens = batch.shape[0] * (batch.shape[1] - 1) // (mesh.size() if cp_mode else 1)
    return per_block / tokens


def context_parallel_rows(world: int, batch) -> list[dict]:
    """Each rank's activations at cp=2 in each mode against one process's on the same batch
    (fp32, no checkpointing): per block and token (of this rank's half of every sequence), and
    the 4-block step's whole activations, as a share of one process's (issue 25: at most 0.55)."""
    from torch.distributed.device_mesh import init_device_mesh

    single_total: list[float] = []
    single = activations_per_block(None, batch, totals=single_total, chunk=CP_CHUNK)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    rows = []
    for mode in ("allgather", "ulysses"):
        total: list[float] = []
        per_block = activations_per_block(mesh, batch, totals=total, cp_mode=mode, chunk=CP_CHUNK)
        rows.append(
            {
                "mode": mode,
                "per_block_token": per_block,
                "single_per_block_token": single,
                "share_of_single": total[0] / single_total[0],
            }
        )
    return rows


def table(mesh, batch, tp2_losses: list | None = None) -> list[dict]:
    """The activation bytes per token and block of every row: one process and tp=2 with SP,
    fp32 and bf16-mixed, no / op / full checkpointing. `tp2_losses` receives the losses of the
    plain fp32 tp=2 row's 4-block model."""
    rows = []
    for tp, row_mesh in ((1, None), (2, mesh)):
        for precision in PRECISIONS:
            for ac in CHECKPOINTING:
                plain_tp2 = tp == 2 and precision == "32-true" and ac == 0
                losses = tp2_losses if plain_tp2 else None
                measured = activations_per_block(row_mesh, batch, ac, precision, losses=losses)
                rows.append(
                    {"tp": tp, "precision": precision, "checkpointing": ac, "measured": measured}
                )
    return rows


def step_fn(
    model, head, opt, batch, tp: bool, precision: str = "32-true", positions=None, chunk=CHUNK
):
    """One training step; with `positions` (context parallelism) only those tokens of every
    sequence, inputs and targets alike."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    extra = {}
    if positions is not None:
        inputs, targets = inputs[:, positions], targets[:, positions]
        extra = {"positions": positions}

    def step():
        opt.zero_grad()
        autocast = torch.autocast(
            "cpu", torch.bfloat16, enabled=precision == "bf16-mixed", cache_enabled=False
        )
        with loss_parallel() if tp else torch.enable_grad():
            with autocast:
                hidden = model(inputs, **extra)
                loss = chunked_cross_entropy(hidden, head.weight, targets, chunk)
            loss.backward()
        opt.step()
        step.losses.append(float(loss.full_tensor() if tp else loss.detach()))

    step.losses = []
    return step


def main(out: str) -> None:
    dist.init_process_group("gloo")
    mesh = Layout(tp=2).build_mesh("cpu")["tp"]
    batch = torch.randint(0, 512, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))
    result = {"tokens": BATCH * SEQ, "tp2 losses 4": []}
    result["table"] = table(mesh, batch, result["tp2 losses 4"])
    result["context_parallel"] = context_parallel_rows(dist.get_world_size(), batch)
    model, head = build(4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = step_fn(model, head, opt, batch, tp=False)
    step()
    step()
    result["single losses 4"] = step.losses
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    from lightning_dist.runtime.process_end import run_then_end

    run_then_end(main, sys.argv[1])
