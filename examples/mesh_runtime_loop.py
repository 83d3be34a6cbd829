"""A plain PyTorch training loop over the mesh runtime: no Lightning, any layout.

    torchrun --nproc-per-node 2 examples/mesh_runtime_loop.py --tp 2
    torchrun --nproc-per-node 2 examples/mesh_runtime_loop.py --pp 2
    torchrun --nproc-per-node 4 examples/mesh_runtime_loop.py --dp-shard 2 --cp 2 --save out/step10
    torchrun --nproc-per-node 2 examples/mesh_runtime_loop.py --dp-replicate 2 --shard-optimizer

`MeshRuntime(layout, options)` builds the device mesh; `runtime.parallelize(model, init_seed=...)`
applies the layout to a meta-device model and materialises this rank's part;
`runtime.train_step(micro_batches, loss_fn, optimizer, max_norm=...)` runs one optimizer step
(the pipeline schedule or a forward and backward per micro-batch, the context-parallel cut,
clipping by the whole model's gradient norm) and returns the loss averaged over every rank;
`runtime.save(path, [optimizer])` writes a checkpoint folder in the format of every strategy:
`python -m lightning_dist.checkpoint inspect PATH` describes it and `train.py
trainer.init_from=PATH` (any strategy, any layout) starts from its weights.

With the defaults below (those of `python train.py model=llama_debug data=synthetic
trainer.max_steps=10`) every layout prints the losses of that Trainer run: within 1e-6
relative of its single-process run (tests/dist/test_mesh_runtime_dist.py), and equal to the
Trainer's run of the same layout (tp2 and fsdp2, measured once).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader

from lightning_dist.layout import batch_plan
from lightning_dist.lm.datasets import SyntheticTokens
from lightning_dist.lm.sampling import GlobalBatchSampler
from lightning_dist.mesh import MeshRuntime, MicroBatch
from lightning_dist.models.args import ModelArgs
from lightning_dist.options import PRESETS

DEBUG_MODEL = ModelArgs(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=512,
                        ffn_hidden_size=128, max_seq_len=256)  # fmt: skip
"""conf/model/llama_debug.yaml."""


@dataclass(frozen=True, kw_only=True)
class LoopSettings:
    """What the loop trains with; the defaults are conf/train.yaml's with data=synthetic."""

    steps: int = 10
    seed: int = 1234
    seq_len: int = 128
    global_batch_size: int = 8
    micro_batch_size: int | None = None
    num_samples: int = 4096
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    max_norm: float | None = 1.0


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, a plain tensor (a DTensor under loss parallelism)."""
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def optimizer_for(model: torch.nn.Module, s: LoopSettings) -> torch.optim.Optimizer:
    """AdamW, with weight decay on the matrices only (norm weights and biases are vectors)."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for _, p in params if p.ndim >= 2], "weight_decay": s.weight_decay},
        {"params": [p for _, p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=s.lr, betas=s.betas, eps=s.eps)


def lr_multiplier(s: LoopSettings):
    """Linear warm-up, then a cosine decay to `min_lr_ratio` at the last step."""

    def multiplier(step: int) -> float:
        if step < s.warmup_steps:
            return (step + 1) / s.warmup_steps
        progress = min(1.0, (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps))
        return s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return multiplier


def train(
    runtime: MeshRuntime, args: ModelArgs, s: LoopSettings
) -> tuple[list[float], torch.optim.Optimizer]:
    """Train `args`'s model for `s.steps` steps under `runtime` (which then holds the model);
    the loss of every step, and the optimizer."""
    with torch.device("meta"):
        meta_model = args.build()
    runtime.check_model(meta_model)  # one line naming the numbers if the layout cannot split it
    model = runtime.parallelize(meta_model, init_seed=s.seed)
    optimizer = runtime.shard_optimizer(optimizer_for(model, s))  # itself, unless ZeRO-1
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(s))
    micro, accumulate = batch_plan(s.global_batch_size, runtime.dp_size, s.micro_batch_size)
    data = SyntheticTokens(s.num_samples, s.seq_len, args.vocab_size, s.seed)
    sampler = GlobalBatchSampler(len(data), s.global_batch_size, micro, runtime.dp_rank,
                                 runtime.dp_size, seed=s.seed)  # fmt: skip
    batches = iter(DataLoader(data, batch_size=micro, sampler=sampler, drop_last=True))
    losses = []
    for _ in range(s.steps):
        windows = [next(batches).to(runtime.device) for _ in range(accumulate)]
        step = [MicroBatch(w[:, :-1], w[:, 1:]) for w in windows]
        loss = runtime.train_step(step, loss_fn, optimizer, max_norm=s.max_norm)
        schedule.step()
        losses.append(float(loss))
    return losses, optimizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for dim in ("dp-replicate", "dp-shard", "cp", "tp", "pp"):
        parser.add_argument(f"--{dim}", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--shard-optimizer", action="store_true", help="ZeRO-1 over the dp-replicate ranks"
    )
    parser.add_argument("--save", default=None, help="write a checkpoint folder here at the end")
    a = parser.parse_args()
    dist.init_process_group("gloo")
    degrees = dict(dp_replicate=a.dp_replicate, dp_shard=a.dp_shard, cp=a.cp, tp=a.tp, pp=a.pp)
    knobs: dict = {k: v for k, v in degrees.items() if v > 1}
    if a.shard_optimizer:
        knobs["shard_optimizer"] = True
    options = PRESETS["3d"].build(knobs, "mesh_runtime_loop")
    runtime = MeshRuntime(options.declared_layout(num_nodes=1), options, device="cpu")
    losses, optimizer = train(runtime, DEBUG_MODEL, LoopSettings(steps=a.steps))
    if a.save:
        runtime.save(a.save, [optimizer], meta={"global_step": a.steps})
    if dist.get_rank() == 0:
        print(f"layout {runtime.layout.describe()}: losses {losses}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
