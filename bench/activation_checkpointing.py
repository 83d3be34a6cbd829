"""Benchmark of activation checkpointing choices and per-block compilation (not a test).

    python bench/activation_checkpointing.py --repeats 5 --steps 8

One process, one thread, our Llama model (dim 256, 4 layers, 4 heads, seq 128, batch 4, fp32).
For each setting of `strategy.activation_checkpointing` (0, op, full, 2) with and without
`compile_backend` (see --compile): the activation memory of one training step (torch's
MemTracker: peak bytes of tensors created in forward and kept for backward) and the median
step time. Settings are interleaved inside each repeat so that load on the machine hits them
alike; the table gives the median and min-max over repeats of each repeat's median step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from lightning_dist.measure.step_memory import measure_step  # noqa: E402
from lightning_dist.models.args import ModelArgs  # noqa: E402
from lightning_dist.models.materialize import materialize  # noqa: E402
from lightning_dist.parallel.activation_checkpoint import apply_activation_checkpointing  # noqa: E402
from lightning_dist.parallel.compile import apply_compile  # noqa: E402
from lightning_dist.parallel.fsdp import find_block_types  # noqa: E402

ARGS = ModelArgs(
    dim=256, n_layers=4, n_heads=4, vocab_size=512, ffn_hidden_size=704, max_seq_len=128
)
SETTINGS = (0, "op", "full", 2)
NAMES = {0: "none", "op": "op (selective)", "full": "full (every block)", 2: "every 2nd block"}


def build(setting, backend: str | None):
    with torch.device("meta"):
        model = ARGS.build()
    model = materialize(model, torch.device("cpu"), seed=0)
    blocks = find_block_types(model)
    apply_activation_checkpointing(model, blocks, every_n=setting)
    if backend:
        apply_compile(model, blocks, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optimizer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--compile", default=None, help="also time each setting compiled")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokens = torch.randint(0, ARGS.vocab_size, (args.batch, ARGS.max_seq_len + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    variants = [(s, None) for s in SETTINGS]
    if args.compile:
        variants += [(s, args.compile) for s in SETTINGS]
    models = {v: build(*v) for v in variants}

    def step(model, optimizer):
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    memory = {}
    for v, (model, opt) in models.items():
        step(model, opt)  # warm-up (and compilation)
        memory[v] = measure_step(lambda m=model, o=opt: step(m, o), model, [opt])["activations"]
    times = {v: [] for v in variants}
    for _ in range(args.repeats):
        for v, (model, opt) in models.items():
            per_step = []
            for _ in range(args.steps):
                start = time.perf_counter()
                step(model, opt)
                per_step.append(time.perf_counter() - start)
            times[v].append(statistics.median(per_step))
    base = statistics.median(times[(0, None)])
    print(
        "| activation_checkpointing | compile | activations (MiB) | step (s), median (min-max) "
        "| step / none |"
    )
    print("| --- | --- | --- | --- | --- |")
    for v in variants:
        t = times[v]
        print(
            f"| {NAMES[v[0]]} | {v[1] or 'off'} | {memory[v] / 2**20:.1f} | "
            f"{statistics.median(t):.3f} ({min(t):.3f}-{max(t):.3f}) | "
            f"{statistics.median(t) / base:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
