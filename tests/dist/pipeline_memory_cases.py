"""Memory of a pipeline stage per training step, measured with MemTracker in gloo ranks.

`stage_memory(cases)` runs in every rank of a pipeline (a `World` case, or torchrun through
bench/pipeline_memory.py): for each case (schedule, virtual stages, whether the stages release
each microbatch's buffers) it builds a small Llama-shaped model's pipeline, runs one step to
set the schedule up, then measures the next step's forward and backward (no optimizer step:
the gradients stay, so the model state is the same before and after) with `StepMemoryMeter`.
Tensors the stages hold from the first step (torch's receive buffers) are tracked as well, so
the peak is everything this rank holds. It also measures one microbatch through this rank's
stages alone (its activations), the number the in-flight bound is made of.
"""

from __future__ import annotations

MODEL = dict(
    dim=64, n_layers=8, n_heads=4, n_kv_heads=2, vocab_size=512, ffn_hidden_size=128,
    max_seq_len=256,
)  # fmt: skip
"""llama_debug's shape with 8 layers (pp 4 x 2 virtual stages needs 8)."""
MICROBATCHES, MICRO_BATCH_SIZE, SEQ = 8, 2, 128
SEED = 7


def _loss_fn(logits, targets):
    import torch.nn.functional as F

    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def _held_tensors(pipelined) -> list:
    """The receive buffers (activations and gradients) every stage of `pipelined` holds."""
    out = []
    for stage in pipelined.stages:
        for infos in (*stage.args_recv_info.values(), *stage.grad_recv_info.values()):
            out.extend(i.buffer for i in infos if getattr(i, "buffer", None) is not None)
    return out


def _build(layout, release: bool):
    import torch

    from lightning_dist.models.args import ModelArgs
    from lightning_dist.models.materialize import materialize
    from lightning_dist.parallel.pipeline import PipelinedModel, stage_modules

    mesh = layout.build_mesh("cpu")
    with torch.device("meta"):
        model = ModelArgs(**MODEL).build()
    model = materialize(model, torch.device("cpu"), SEED)
    parts = stage_modules(model, layout, mesh["pp"].get_local_rank())
    group = mesh["pp"].get_group()
    return PipelinedModel(parts, layout, group, torch.device("cpu"), in_flight_only=release)


def _one_microbatch(pipelined, batch) -> tuple[int, int]:
    """(peak bytes beyond the model state, activations kept at the turn to backward) of one
    microbatch run through this rank's stages alone: forwards in order, then backwards in
    reverse, each stage from a stand-in input and keeping its output until its backward (as
    a pipeline stage does); no pipeline buffers."""
    import torch

    from lightning_dist.measure.step_memory import StepMemoryMeter

    inputs, targets = batch[:MICRO_BATCH_SIZE, :-1], batch[:MICRO_BATCH_SIZE, 1:]
    meter = StepMemoryMeter(module_hooks=False)
    meter.start(pipelined, [])
    outputs = []
    for stage_id, part in zip(pipelined.stage_ids, pipelined.parts, strict=True):
        hidden = torch.randn(MICRO_BATCH_SIZE, SEQ, MODEL["dim"], requires_grad=True)
        out = part(inputs if stage_id == 0 else hidden)
        loss = _loss_fn(out, targets) if getattr(part, "output", None) is not None else None
        outputs.append((out, loss))
        del out, hidden, loss
    while outputs:
        out, loss = outputs.pop()
        if loss is not None:
            loss.backward()
        else:
            out.backward(torch.ones_like(out))
        del out, loss
    result = meter.stop()
    return result["total"] - result["params"] - result["grads"], result["activations"]


def stage_memory(cases: list[dict]) -> list[dict]:
    """One row per case for this rank: its pipeline rank, stages, the step's peak of live tensors
    (`peak`), the model state in it (`model_state`: parameters and gradients), the rest
    (`step`), and one microbatch through its stages alone (`one_microbatch`: its peak beyond
    the model state; `one_microbatch_kept`: its activations at the turn to backward)."""
    import torch
    import torch.distributed as dist

    from lightning_dist.layout import Layout
    from lightning_dist.measure.step_memory import StepMemoryMeter, model_state_bytes

    if not dist.is_initialized():
        from world import init_group

        init_group()
    pp = dist.get_world_size()
    batch = torch.randint(
        0, MODEL["vocab_size"], (MICROBATCHES * MICRO_BATCH_SIZE, SEQ + 1),
        generator=torch.Generator().manual_seed(SEED),
    )  # fmt: skip
    rows = []
    for case in cases:
        layout = Layout(
            pp=pp, schedule=case["schedule"], virtual_stages=case["virtual_stages"],
            microbatches=MICROBATCHES,
        ).resolve(pp)  # fmt: skip
        pipelined = _build(layout, case["release"])
        pipelined(batch[:, :-1], batch[:, 1:], _loss_fn)  # sets the schedule up
        meter = StepMemoryMeter(module_hooks=False)
        meter.start(pipelined, [], external=_held_tensors(pipelined))
        loss = pipelined(batch[:, :-1], batch[:, 1:], _loss_fn)
        result = meter.stop()
        state = model_state_bytes(pipelined, [])
        one, kept = _one_microbatch(pipelined, batch)
        rows.append({
            **case, "pp": pp, "rank": dist.get_rank(), "stages": pipelined.stage_ids,
            "peak": result["total"], "model_state": state["params"] + state["grads"],
            "step": result["total"] - state["params"] - state["grads"],
            "one_microbatch": one, "one_microbatch_kept": kept,
            "loss": float(loss),
        })  # fmt: skip
        del pipelined
    dist.barrier()
    return rows


def cases(release_choices=(False, True)) -> list[dict]:
    """1F1B and Interleaved1F1B (2 virtual stages), before (`release=False`) and after."""
    return [
        dict(schedule=s, virtual_stages=v, release=r)
        for s, v in (("1F1B", 1), ("Interleaved1F1B", 2))
        for r in release_choices
    ]


if __name__ == "__main__":  # torchrun --nproc-per-node PP tests/dist/pipeline_memory_cases.py OUT
    import json
    import sys

    import torch.distributed as dist

    from lightning_dist.runtime.process_end import run_then_end

    def main(out: str) -> None:
        dist.init_process_group("gloo")
        rows = stage_memory(cases())
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, rows)
        if dist.get_rank() == 0:
            with open(out, "w") as f:
                json.dump([r for part in every for r in part], f)
        dist.destroy_process_group()

    run_then_end(main, sys.argv[1])
