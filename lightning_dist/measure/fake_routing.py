"""Balanced routing for the dry run of a mixture of experts (`measure/fake_rank.py`).

A router picks experts by the values of its scores, and the expert-parallel dispatch sizes its
all-to-alls by how many rows each expert got; fake tensors hold no values, so neither can run
on them as they are (torch 2.13: `bincount` has no fake output shape, `tolist` no value). The
dry run therefore routes as a perfectly balanced router would: the router itself still runs
(its matmul, top-k and gradient), but each expert counts as receiving the same number of
rows, and each rank sends every peer of its ep group the same share of its rows and receives
as much from each. The planner assumes the same balance (`planner.experts.all_to_all_bytes`),
so the dry run's ep traffic and the planner's compare like for like; a real router is only
ever as balanced as its load-balancing loss or bias makes it.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
from torch import nn

from lightning_dist.models.moe import moe_layers
from lightning_dist.parallel.expert_parallel import ExpertParallel


def even_shares(rows: int, parts: int) -> list[int]:
    """`rows` cut into `parts` shares as equal as integers allow (the larger ones first)."""
    share, left = divmod(rows, parts)
    return [share + (i < left) for i in range(parts)]


def _balanced_routes(num_experts: int, flat: torch.Tensor, bsz: int) -> torch.Tensor:
    """`MoE.count_routes` under fake tensors: a [bsz, num_experts] tensor of counts (values
    none, as every fake tensor's; only the rows the dispatch sends are sized, below)."""
    return flat.new_zeros(bsz, num_experts)


class BalancedExpertParallel(ExpertParallel):
    """`ExpertParallel` whose splits follow balanced routing (module docs). It still
    exchanges the per-expert counts, so its collectives are the real dispatch's."""

    def __init__(self, group) -> None:
        super().__init__(group)
        self._rows = 0
        self._received = 0

    def __call__(self, experts: nn.Module, x: torch.Tensor, counts: torch.Tensor):
        self._rows = x.shape[0]
        return super().__call__(experts, x, counts)

    def exchange_counts(self, counts: torch.Tensor) -> tuple[torch.Tensor, list[int], list[int]]:
        ep, me = dist.get_world_size(self.group), dist.get_rank(self.group)
        sent = counts.view(ep, -1)
        received = torch.empty_like(sent)
        dist.all_to_all_single(received, sent.contiguous(), group=self.group)
        send_rows = even_shares(self._rows, ep)
        recv_rows = [send_rows[me]] * ep  # every peer routes as many rows, alike
        self._received = sum(recv_rows)
        return received, send_rows, recv_rows

    def by_local_expert(self, received: torch.Tensor) -> torch.Tensor:
        return torch.arange(self._received, device=received.device)


def balance_routing(model: nn.Module) -> int:
    """Route every MoE layer of `model` as a balanced router would (module docs); returns
    how many layers it changed."""
    layers = moe_layers(model)
    for moe in layers:
        moe.count_routes = partial(_balanced_routes, moe.num_experts)  # type: ignore[method-assign]
        if isinstance(moe.run_experts, ExpertParallel):
            moe.run_experts = BalancedExpertParallel(moe.run_experts.group)
    return len(layers)
