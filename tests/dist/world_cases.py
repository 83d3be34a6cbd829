"""Cases of tests/dist/test_world.py, run inside the ranks of a `World`."""

import os


def all_reduce_rank() -> float:
    import torch
    import torch.distributed as dist
    from world import init_group

    init_group()
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    return value.item()


def fail_on_rank_one() -> int:
    rank = int(os.environ["RANK"])
    if rank == 1:
        raise ValueError("rank one refuses")
    return rank


def rank_zero_waits_alone() -> None:
    import time

    import torch.distributed as dist
    from world import init_group

    init_group(timeout_s=600)
    if dist.get_rank() == 0:
        dist.barrier()  # rank 1 never comes: it is stuck elsewhere
    else:
        time.sleep(3600)


def group_left_by_the_last_case() -> bool:
    import torch.distributed as dist

    return dist.is_initialized()
