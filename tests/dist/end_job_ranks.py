"""Rank script for tests/dist/test_process_group_end.py: a torchrun-started rank calls `end_job` the
way train.py does after a finished run, keeps a working group, and ends as train.py does
(`end_process`), recording from its exit work whether the group was still there."""

import atexit
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from lightning_dist.runtime.process_end import end_process
from lightning_dist.strategies.launch import end_job

out = Path(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()


def record_at_exit() -> None:
    # Registered before end_job's own hook, so it runs after it (atexit runs last-in first-out):
    # that hook leaves the group alone once end_process has begun.
    Path(f"{out}.rank{rank}").write_text(json.dumps({"group_alive": dist.is_initialized()}))


atexit.register(record_at_exit)
# What end_job reads of the Trainer: no launcher of its own (torchrun started this rank).
end_job(SimpleNamespace(strategy=SimpleNamespace(), world_size=dist.get_world_size()))
alive_after_end_job = dist.is_initialized()
total = torch.ones(1)
dist.all_reduce(total)  # the group still works: a later job of this process could use it
if rank == 0:
    out.write_text(json.dumps({"alive_after_end_job": alive_after_end_job, "sum": total.item()}))
end_process(0)  # Python's exit work, then os._exit: no gloo teardown to abort in
