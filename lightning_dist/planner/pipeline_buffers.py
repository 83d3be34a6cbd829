"""What a pipeline stage holds beside its blocks' activations, as `parallel/pipeline_stage.py`
keeps it, and how many microbatches it holds at its peak.

`InFlightStage` keeps a microbatch's receive buffers and its output only from the receive to
the end of its backward, so a rank's peak holds its in-flight microbatches (`inflight_
microbatches`) and nothing of the others. bench/pipeline_memory.py measures each pipeline rank
against `stage_memories` (pp 2 and 4, 8 microbatches, 1F1B and Interleaved1F1B).
"""

from __future__ import annotations

from lightning_dist.layout import Layout


def inflight_microbatches(layout: Layout, stage: str | int, microbatches: int) -> float:
    """Microbatches, in whole-stage units, whose activations one rank holds at its peak: the
    most forwards it has run and not yet finished the backward of (for the zero-bubble
    schedules, the weight-gradient half), as torch's own schedule tables order them
    (`tests/unit/test_planner.py` replays those tables, with `bench/schedules.py`, and finds
    these counts exactly for pp 2 to 8, m from pp to 4pp, v 2 to 4).

    `stage` is the pipeline rank r, or 'first' (0), 'only' (0) or 'last' (pp - 1). A rank of an interleaved schedule
    runs v chunks of its stage, so c held chunks are c / v stage-microbatches. With
    k = m // max(1, m // pp), the microbatches per round of torch's interleaved schedules:

    - no PP: 1 (gradient accumulation runs microbatches one after another); GPipe: m;
    - 1F1B: min(m, pp - r);
    - Interleaved1F1B: min(m v, (v - 1) k + 2 (pp - 1 - r) + 1) chunks (the warm-up of
      Narayanan et al. 2021, capped at every chunk of every microbatch);
    - InterleavedZeroBubble: min(m v, (v - 1) k + pp) chunks, alike on every rank;
    - ZBVZeroBubble (v = 2): min(2 pp, m + 1 + r) chunks.
    """
    pp, m, v = layout.pp, microbatches, layout.virtual_stages
    if pp == 1:
        return 1.0
    rank = stage if isinstance(stage, int) else 0 if stage in ("first", "only") else pp - 1
    per_round = m // max(1, m // pp)
    schedule = layout.schedule
    if schedule == "GPipe":
        return float(m)
    if schedule == "Interleaved1F1B":
        return min(m * v, (v - 1) * per_round + 2 * (pp - 1 - rank) + 1) / v
    if schedule == "InterleavedZeroBubble":
        return min(m * v, (v - 1) * per_round + pp) / v
    if schedule == "ZBVZeroBubble":
        return min(2 * pp, m + 1 + rank) / 2
    return float(min(m, pp - rank))  # 1F1B


def pipeline_bytes(model, layout: Layout, settings, shape, microbatches: int) -> float:
    """Bytes one pipeline rank holds at its peak beside its blocks' activations
    (`planner.memory.activation_bytes`), with R = one microbatch's hidden states (rank tokens x
    dim / sp, in the residual's dtype) and n x v in-flight chunk-microbatches:

    - the output of each in-flight chunk-microbatch, which the stage keeps for its backward
      (n v R, less one on the rank with the model's last chunk, whose output is the logits);
    - the rank with the loss keeps its logits too (tokens x vocab / tp, in the matmul dtype),
      beside what the cross-entropy's backward holds (`loss_bytes_per_logit`); not under the
      chunked loss, which keeps none;
    - the backward of one microbatch: the output gradient it received and the input gradient
      it sends, R each (a rank with the embedding sends none, one with the loss receives none);
    - under a multi-stage schedule (v > 1), the gradients the rank's first chunk sent, m R
      (not on the rank with the embedding, whose first chunk sends none): torch's schedule
      holds every send to the step's end, and nothing on the rank tells when those arrived
      (a later chunk's are freed by an earlier chunk's backward of the same microbatch);
    - a rank without the loss peaks inside that backward, not at the turn to it: one block's
      feed-forward gradients, two of hidden_dim / tp per token in the matmul dtype (measured
      here: bench/pipeline_memory.py; the rank with the loss peaks in the cross-entropy).

    The receive buffer of an in-flight input is the first block's input, already an activation.
    """
    tokens = settings.rank_tokens(layout)
    sp = layout.tp if settings.sequence_parallel else 1
    hidden = tokens * model.dim / sp * settings.residual_bytes
    w = settings.matmul_bytes
    v = layout.virtual_stages
    chunks_in_flight = inflight_microbatches(layout, shape.rank, microbatches) * v
    outputs = max(0.0, chunks_in_flight - shape.has_output) * hidden
    edges = (2 if v > 1 else 2 - shape.has_embedding - shape.has_output) * hidden
    if shape.has_output:
        chunked = getattr(model, "loss_chunk_tokens", 0)
        last = 0.0 if chunked else tokens * model.vocab_size / layout.tp * w
    else:
        last = 2 * tokens * model.hidden_dim / layout.tp * w
    sent = microbatches * hidden if v > 1 and not shape.has_embedding else 0.0
    return outputs + edges + sent + last
