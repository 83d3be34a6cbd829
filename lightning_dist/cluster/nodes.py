"""Which node each rank runs on, and which mesh groups cross nodes.

The node of a rank comes from its launcher, never from arithmetic on the rank: torchrun's
`GROUP_RANK` (the agent's index, which also orders torchrun's global ranks), else SLURM's
`SLURM_NODEID`, else `NODE_RANK` (Lightning's own launcher), else node 0. Hostnames cannot
tell nodes apart (two torchrun agents on one machine share one), so they are only recorded.
Every rank contributes its node, local rank and hostname to one all-gather right after the
process group exists; every rank then holds the same `NodeMap` and makes the same decisions.

A mesh group is `intra_node` when all its ranks are on one node, else `inter_node`.
Tensor-parallel groups must be intra-node (every layer all-reduces over them): a tp group
that crosses nodes is an error. HSDP's shard groups crossing nodes only cost speed: a warning.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch

INTRA_NODE = "intra_node"
INTER_NODE = "inter_node"
HOSTNAME_BYTES = 64
"""Hostnames are gathered as fixed-size byte rows (tensors, so NCCL can carry them too)."""


class NodePlacementError(ValueError):
    """Ranks are placed on nodes in a way the run cannot use; one line naming the fix."""


def this_node() -> tuple[int, str]:
    """(node index, where it came from) of this process, from its launcher's environment."""
    if "TORCHELASTIC_RUN_ID" in os.environ and "GROUP_RANK" in os.environ:
        return int(os.environ["GROUP_RANK"]), "torchrun GROUP_RANK"
    if "SLURM_NODEID" in os.environ:
        return int(os.environ["SLURM_NODEID"]), "SLURM_NODEID"
    if "NODE_RANK" in os.environ:
        return int(os.environ["NODE_RANK"]), "NODE_RANK"
    return 0, "one node"


def _local_rank() -> int:
    for name in ("LOCAL_RANK", "SLURM_LOCALID"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


@dataclass(frozen=True, kw_only=True)
class NodeMap:
    """The node, local rank and hostname of every global rank."""

    node_of_rank: list[int]
    local_rank_of_rank: list[int]
    hostname_of_rank: list[str]
    source: str
    """Which environment variable named the nodes (`this_node`)."""

    @property
    def nodes(self) -> list[int]:
        return sorted(set(self.node_of_rank))

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    def ranks_of_node(self) -> dict[int, list[int]]:
        ranks: dict[int, list[int]] = {}
        for rank, node in enumerate(self.node_of_rank):
            ranks.setdefault(node, []).append(rank)
        return dict(sorted(ranks.items()))

    def link(self, ranks: list[int]) -> str:
        """`intra_node` if all of `ranks` are on one node, else `inter_node`."""
        return INTRA_NODE if len({self.node_of_rank[r] for r in ranks}) <= 1 else INTER_NODE

    def summary(self) -> dict:
        """summary.json's `nodes` (without the mesh groups, which `Placement` adds)."""
        ranks = self.ranks_of_node()
        return {
            "num_nodes": self.num_nodes,
            "source": self.source,
            "node_of_rank": self.node_of_rank,
            "local_rank_of_rank": self.local_rank_of_rank,
            "ranks_of_node": [ranks[n] for n in self.nodes],
            "hostname_of_node": [self.hostname_of_rank[ranks[n][0]] for n in self.nodes],
        }


def local_node_map() -> NodeMap:
    """The node map of a one-process run."""
    node, source = this_node()
    return NodeMap(
        node_of_rank=[node],
        local_rank_of_rank=[_local_rank()],
        hostname_of_rank=[socket.gethostname()],
        source=source,
    )


def gather_node_map(device: torch.device) -> NodeMap:
    """Every rank's node, local rank and hostname (one all-gather over the default group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local_node_map()
    node, source = this_node()
    name = socket.gethostname().encode()[:HOSTNAME_BYTES].ljust(HOSTNAME_BYTES, b"\0")
    mine = torch.tensor([node, _local_rank(), *name], dtype=torch.int64, device=device)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    table = torch.stack(rows).cpu().tolist()
    return NodeMap(
        node_of_rank=[r[0] for r in table],
        local_rank_of_rank=[r[1] for r in table],
        hostname_of_rank=[bytes(r[2:]).rstrip(b"\0").decode(errors="replace") for r in table],
        source=source,
    )


def check_node_counts(nodes: NodeMap, *, num_nodes: int, devices: int) -> None:
    """Raise NodePlacementError unless the launcher started `num_nodes` nodes of `devices`
    ranks each, as the configuration says (the layout's defaults follow the node count)."""
    counts = [len(r) for r in nodes.ranks_of_node().values()]
    if len(set(counts)) > 1:
        per_node = ", ".join(f"node {n}: {len(r)}" for n, r in nodes.ranks_of_node().items())
        raise NodePlacementError(
            f"the nodes run different numbers of ranks ({per_node}, from {nodes.source}); "
            "start the same number on every node (torchrun --nproc-per-node)"
        )
    if nodes.num_nodes != num_nodes or counts[0] != devices:
        raise NodePlacementError(
            f"the launcher started {len(nodes.node_of_rank)} ranks on {nodes.num_nodes} node(s) "
            f"({counts[0]} per node, from {nodes.source}), but hardware.num_nodes={num_nodes} "
            f"hardware.devices={devices}; set hardware.num_nodes={nodes.num_nodes} "
            f"hardware.devices={counts[0]}"
        )


@dataclass(frozen=True, kw_only=True)
class Placement:
    """The node map and the rank groups of each parallel dimension of size > 1."""

    nodes: NodeMap
    groups: dict[str, list[list[int]]]
    """Each dimension's groups of global ranks, as the process groups hold them."""

    def links(self) -> dict[str, str]:
        """Each dimension's link: `inter_node` if any of its groups crosses nodes."""
        return {
            dim: INTER_NODE if INTER_NODE in {self.nodes.link(g) for g in groups} else INTRA_NODE
            for dim, groups in self.groups.items()
        }

    def check(self, hsdp: bool) -> list[str]:
        """Raise NodePlacementError if a tensor-parallel group crosses nodes; return warnings
        (HSDP shard groups that cross nodes, when `hsdp`)."""
        for group in self.groups.get("tp", []):
            if self.nodes.link(group) == INTER_NODE:
                on = sorted({self.nodes.node_of_rank[r] for r in group})
                raise NodePlacementError(
                    f"tensor-parallel group {group} spans nodes {on} (from {self.nodes.source}); "
                    "tp must stay inside a node: give every node consecutive ranks (torchrun "
                    "does; SLURM with --distribution=block) and a tp that divides hardware.devices"
                )
        shard = self.groups.get("dp_shard", [])
        if hsdp and any(self.nodes.link(g) == INTER_NODE for g in shard):
            return [
                f"HSDP shard groups of {len(shard[0])} ranks cross nodes (each node has "
                f"{len(self.nodes.node_of_rank) // self.nodes.num_nodes} ranks), so every "
                "all-gather crosses the network; strategy.dp_replicate="
                f"{self.nodes.num_nodes} keeps each inside a node"
            ]
        return []

    def summary(self) -> dict:
        """summary.json's `nodes`: the node map and each dimension's groups and link."""
        links = self.links()
        mesh = {dim: {"groups": g, "link": links[dim]} for dim, g in self.groups.items()}
        return {**self.nodes.summary(), "mesh": mesh}


def mesh_groups(mesh, dims: tuple[str, ...]) -> dict[str, list[list[int]]]:
    """The rank groups of each named dimension of size > 1 of `mesh` (a DeviceMesh); every
    rank can read them from the mesh's rank table, with no communication."""
    names = list(mesh.mesh_dim_names)
    table = mesh.mesh
    groups = {}
    for dim in dims:
        axis = names.index(dim)
        if table.size(axis) == 1:
            continue
        moved = table.movedim(axis, -1).reshape(-1, table.size(axis))
        groups[dim] = sorted(moved.tolist())
    return groups
