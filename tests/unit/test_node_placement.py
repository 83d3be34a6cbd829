"""The node map's checks in one process (lightning_dist/cluster/nodes.py): a TP group that spans
nodes is an error naming the group, HSDP shards across nodes only warn, and the node counts must
match the config. (The two-node torchrun runs are tests/cluster/test_multinode.py.)
"""

from __future__ import annotations

import pytest

from lightning_dist.cluster.nodes import (
    INTER_NODE,
    INTRA_NODE,
    NodeMap,
    NodePlacementError,
    Placement,
    check_node_counts,
)

# The groups each job's DeviceMesh (or, for DDP, its layout) must hold, and their link.


# --- the node map and its checks, in one process --------------------------------------------


def _nodes(node_of_rank: list[int]) -> NodeMap:
    n = len(node_of_rank)
    return NodeMap(
        node_of_rank=node_of_rank,
        local_rank_of_rank=[0] * n,
        hostname_of_rank=["host"] * n,
        source="SLURM_NODEID",
    )


def test_tp_across_nodes_is_an_error_naming_the_group():
    """SLURM's cyclic distribution puts consecutive ranks on different nodes."""
    cyclic = Placement(nodes=_nodes([0, 1, 0, 1]), groups={"tp": [[0, 1], [2, 3]]})
    with pytest.raises(NodePlacementError, match=r"group \[0, 1\] spans nodes \[0, 1\]"):
        cyclic.check(hsdp=False)
    block = Placement(nodes=_nodes([0, 0, 1, 1]), groups={"tp": [[0, 1], [2, 3]]})
    assert block.check(hsdp=False) == [] and block.links() == {"tp": INTRA_NODE}


def test_hsdp_shards_across_nodes_only_warn():
    groups = {
        "dp_replicate": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "dp_shard": [[0, 1, 2, 3], [4, 5, 6, 7]],
    }
    placement = Placement(nodes=_nodes([0, 0, 1, 1, 2, 2, 3, 3]), groups=groups)
    (warning,) = placement.check(hsdp=True)
    assert "strategy.dp_replicate=4" in warning
    assert placement.links() == {"dp_replicate": INTER_NODE, "dp_shard": INTER_NODE}
    assert placement.check(hsdp=False) == []  # plain FSDP over every node is a choice


def test_node_counts_must_match_the_config():
    with pytest.raises(NodePlacementError, match="set hardware.num_nodes=2 hardware.devices=2"):
        check_node_counts(_nodes([0, 0, 1, 1]), num_nodes=1, devices=4)
    with pytest.raises(NodePlacementError, match=r"node 0: 3, node 1: 1"):
        check_node_counts(_nodes([0, 0, 0, 1]), num_nodes=2, devices=2)
    check_node_counts(_nodes([0, 0, 1, 1]), num_nodes=2, devices=2)
