"""A hand-written PyTorch training loop: the baseline `bench/overhead.py` holds train.py to.

    torchrun --nproc_per_node 2 bench/raw_loop.py --strategy ddp --steps 20 --out times.json

Same model, data, global batch, seed, optimizer, schedule and clipping as
`python train.py model=tiny data=synthetic`, written the way a careful engineer would without
any framework; it records the wall time of every optimizer step.

Under fsdp2 it shards the model as train.py does (`lightning_dist.parallel.fsdp.apply_fsdp`: one
unit per block and the root, the last block kept gathered for backward, one block of explicit
prefetch), so that the comparison measures the framework and not a different FSDP configuration.
`--fsdp torch-defaults` instead calls `fully_shard` with torch's defaults, to measure what that
configuration difference costs.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from lightning_dist.config import compose_config, model_spec
from lightning_dist.layout import batch_plan
from lightning_dist.lm.datasets import SyntheticTokens
from lightning_dist.lm.module import warmup_cosine
from lightning_dist.lm.sampling import GlobalBatchSampler
from lightning_dist.models.materialize import materialize
from lightning_dist.runtime.process_end import end_barrier, run_then_end


def build(strategy: str, overrides: list[str], device: torch.device, fsdp: str = "train"):
    cfg = compose_config([*overrides, f"strategy={strategy}", "paths.output_dir=/tmp"])
    spec = model_spec(cfg)
    with torch.device("meta"):
        model = spec.build()
    model = materialize(model, device, cfg.seed)
    if strategy == "ddp":
        model = DistributedDataParallel(model, broadcast_buffers=False)
    elif fsdp == "torch-defaults":
        from torch.distributed.fsdp import fully_shard

        for block in model.layers.values():
            fully_shard(block)
        fully_shard(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh

        from lightning_dist.parallel.fsdp import apply_fsdp

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        st = cfg.strategy  # train.py's values, so the two stay the same if a default changes
        apply_fsdp(
            model,
            mesh,
            reshard_after_forward=st.reshard_after_forward,
            prefetch_forward=st.prefetch_forward,
            prefetch_backward=st.prefetch_backward,
        )
    return cfg, spec, model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=["ddp", "fsdp2"], default="ddp")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", required=True)
    parser.add_argument("--fsdp", choices=["train", "torch-defaults"], default="train")
    parser.add_argument("overrides", nargs="*", default=["model=tiny", "data=synthetic"])
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    cfg, spec, model = build(args.strategy, args.overrides, device, args.fsdp)
    data, o = cfg.data, cfg.optim
    micro, accumulate = batch_plan(data.global_batch_size, world, data.micro_batch_size)
    dataset = SyntheticTokens(
        vocab_size=spec.vocab_size,
        seq_len=data.seq_len,
        num_samples=data.num_samples,
        seed=cfg.seed,
    )
    sampler = GlobalBatchSampler(len(dataset), data.global_batch_size, micro, rank, world, cfg.seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=micro, sampler=sampler, drop_last=True)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": o.weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=o.lr,
        betas=tuple(o.betas),
        eps=o.eps,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(o.warmup_steps, cfg.trainer.max_steps, o.min_lr_ratio)
    )
    times, losses, batches = [], [], iter(loader)
    start = time.perf_counter()
    for _ in range(args.steps):
        total = torch.zeros(())
        for i in range(accumulate):
            batch = next(batches)
            sync = args.strategy != "ddp" or i == accumulate - 1
            context = model.no_sync() if not sync else torch.enable_grad()
            with context:
                logits = model(batch[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
                (loss / accumulate).backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.gradient_clip_val)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        dist.all_reduce(total)  # the loss we print, as train.py logs it
        losses.append(total.item() / accumulate / world)
        now = time.perf_counter()
        times.append(now - start)
        start = now
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"step_seconds": times, "losses": losses}, f)
    # Both ranks leave together, bounded; the process ends without gloo's C++ teardown, which
    # can hang or abort after the work is done (lightning_dist/runtime/process_end.py).
    end_barrier(timeout_s=120)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run_then_end(main)
