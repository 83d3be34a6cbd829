"""Data-parallel time: the links a mesh group crosses and the data-parallel phases of a step
(DDP's all-reduce, FSDP's gathers and reduce-scatters, HSDP's replica all-reduce, ZeRO-1's
exposed reduce-scatter and gather, DiLoCo's outer sync), each with the compute it may hide
under. `planner/timing.py` combines them with compute, the other dimensions' traffic and the
bubble into a step.
"""

from __future__ import annotations

import math

from lightning_dist.layout import Layout
from lightning_dist.planner.experts import expert_degree
from lightning_dist.planner.memory import SHARDED_MODES
from lightning_dist.planner.settings import (
    HOST_LINK_GBYTES_PER_SEC,
    HOST_OPTIMIZER_PARAMS_PER_SEC,
    NOMINAL_LINK_GBYTES_PER_SEC,
    RING_STEP_LATENCY_S,
)
from lightning_dist.planner.traffic import dp_volumes

DDP_BUCKET_BYTES = 25e6  # DDP's default bucket_cap_mb
ZERO1_GATHERS = 2
"""Parameter groups of ZeRO-1's step (`parallel/sharded_optimizer.py` reduce-scatters each
group's gradients and gathers its slices in pieces): CausalLM has two (weight decay and none)."""
ZERO1_GATHER_ELEMENTS = 1 << 25
"""Elements one of those all-gathers brings back at most, and one reduce-scatter takes in:
`sharded_optimizer.GATHER_ELEMENTS` and `gradient_reduction.REDUCE_ELEMENTS`
(tests/unit/test_planner_layouts.py holds the three equal; the planner imports no torch code)."""
STEP_SCALAR_ALL_REDUCES = 2
"""Small all-reduces every rank runs at every optimizer step whatever its gradients do: the
logged loss's mean (`lm/module.py`) and the NaN guard's flags, which carry the preemption
check (`callbacks/context.StepFlags`). Only their latency counts; under DiLoCo, which leaves the
gradients local, they are the traffic of the steps between syncs."""


def group_span(inner: int, size: int, devices_per_node: int) -> tuple[bool, int]:
    """(crosses nodes, members per node) of a mesh group of `size` ranks strided by `inner`."""
    span = inner * size
    if size == 1 or devices_per_node % span == 0:
        return False, size
    if inner >= devices_per_node:
        return True, 1
    return True, max(1, min(size, devices_per_node // inner))


def link_bandwidth(hardware, crosses_nodes: bool, members_per_node: int) -> float:
    """Bytes/s per rank for a collective over a group.

    Inside a node: the NVLink/PCIe figure. Across nodes the k members of a node share k NICs,
    so a ring (NCCL runs one per NIC) moves k x the per-device network figure, capped by the
    intra-node link it also crosses.
    """
    intra = (hardware.intra_node_gbytes_per_sec or NOMINAL_LINK_GBYTES_PER_SEC) * 1e9
    if not crosses_nodes:
        return intra
    inter = (hardware.inter_node_gbytes_per_sec or NOMINAL_LINK_GBYTES_PER_SEC) * 1e9
    return min(intra, members_per_node * inter)


def mesh_links(hardware, layout: Layout):
    """A function (inner stride, group size) -> (bytes/s, seconds per ring step) of the
    mesh groups of `layout` on `hardware`."""
    per_node = hardware.resolved_devices()

    def link(inner: int, size: int) -> tuple[float, float]:
        """(bytes/s, seconds per ring step) of a group of `size` ranks strided by `inner`; on
        mixed hardware, one whose ranks span node groups (the first such group, from rank 0)
        is capped by the link between the groups (`site_link_*`)."""
        crosses, members = group_span(inner, size, per_node)
        latency = RING_STEP_LATENCY_S["inter" if crosses else "intra"]
        bandwidth = link_bandwidth(hardware, crosses, members)
        if hardware.mixed and crosses:
            names = {hardware.node_group(r * inner // per_node)[0] for r in range(size)}
            if len(names) > 1:
                site = hardware.site_link_gbytes_per_sec
                if site is not None:
                    bandwidth = min(bandwidth, members * site * 1e9)
                if hardware.site_link_latency_ms is not None:
                    latency = max(latency, hardware.site_link_latency_ms / 1e3)
        return bandwidth, latency

    return link


def _ddp_all_reduce_seconds(settings, volume, psi: float, dp: int, bw: float, lat: float) -> float:
    """DDP's all-reduce of a step's gradients: its bytes, and a ring latency per bucket."""
    # DDP buckets the gradients in their own dtype; a compression hook then reduces each
    # bucket (PowerSGD in three all-reduces: the bucket's vectors, its P and Q factors).
    grad_bytes = 2 if settings.precision == "bf16-true" else 4
    buckets = math.ceil(grad_bytes * psi / DDP_BUCKET_BYTES)
    if settings.options.grad_sync.grad_compression == "powersgd":
        buckets *= 3
    return volume.all_reduce / bw + buckets * 2 * math.log2(dp) * lat


def dp_phases(layout, settings, shapes, link, m, fwd, bwd, model=None):
    """Data-parallel traffic as [(comm seconds, compute seconds it may hide under)], plus the
    offload seconds.

    DDP all-reduces the gradients once per step, under the last microbatch's backward. FSDP
    FULL_SHARD all-gathers in forward, all-gathers again and reduce-scatters in backward, for
    every microbatch (FSDP does not skip gradient sync while accumulating) over its shard
    group, dp_shard x cp (context-parallel ranks shard and reduce too), all but the last
    block (`parallel.fsdp.apply_fsdp` keeps it gathered); SHARD_GRAD_OP keeps the forward gather
    for backward. Under PP the stage stays gathered for the whole step: one
    all-gather under the first forward, one reduce-scatter under the last backward. HSDP adds an
    all-reduce of the gradient shard over dp_replicate after each reduce-scatter. ZeRO-1
    (SHARD_OPTIMIZER, as `parallel/sharded_optimizer.py` runs it) reduce-scatters the
    gradients after the last backward and all-gathers the updated parameters after the
    optimizer step, both exposed.
    """
    shape = max(shapes, key=lambda sh: sh.params)
    psi = shape.params
    units = max(sh.layers + len(sh.roots) for sh in shapes)
    p_b, g_b = settings.gathered_param_bytes, settings.gradient_reduce_bytes
    tp, dp, n, r = layout.tp, layout.dp, layout.shard_size, layout.dp_replicate
    if dp * layout.cp == 1:
        return [], 0.0
    volume = dp_volumes(layout, settings, shape, model)
    if settings.sharding == "SHARD_OPTIMIZER":
        # ZeRO-1: the gradients' reduce-scatter after the last backward (the optimizer runs it
        # when the step or clipping asks: not overlapped with backward), then one all-gather
        # of the updated parameters, between the optimizer step and the next forward. Each in
        # pieces per parameter group, a ring of dp - 1 steps each; nothing runs beside them.
        bw, lat = link(tp, dp)
        pieces = ZERO1_GATHERS + int(psi // ZERO1_GATHER_ELEMENTS)  # of each group
        reduce = volume.reduce_scatter / bw + pieces * (dp - 1) * lat
        gather = volume.gather / bw + pieces * (dp - 1) * lat
        return [(reduce, 0.0), (gather, 0.0)], 0.0
    if settings.sharding not in SHARDED_MODES or n == 1:
        bw, lat = link(tp, dp)
        inner = settings.options.grad_sync.diloco_inner_steps
        if inner:  # one all-reduce of the parameter change after every H-th step: exposed
            comm = volume.all_reduce / bw + 2 * math.log2(dp) * lat / inner
            # ... and the step's scalar all-reduces, every step (beside DDP's or FSDP's
            # gradient traffic they are negligible and not counted).
            comm += STEP_SCALAR_ALL_REDUCES * 2 * math.log2(dp) * lat
            return [(comm, 0.0)], 0.0
        return [(_ddp_all_reduce_seconds(settings, volume, psi, dp, bw, lat), bwd)], 0.0
    bw, lat = link(tp, n)
    gather = volume.gather / bw + units * (n - 1) * lat
    regather = volume.regather / bw + (units - 1) * (n - 1) * lat if volume.regather else 0.0
    scatter = volume.reduce_scatter / bw + units * (n - 1) * lat
    ep = expert_degree(layout)
    if volume.expert_gather:  # the experts' own FSDP group: n / ep ranks strided by tp x ep
        bw_e, _ = link(tp * ep, n // ep)
        gather += volume.expert_gather / bw_e
        regather += volume.expert_regather / bw_e
        scatter += volume.expert_reduce_scatter / bw_e
    if r > 1:
        bw_r, lat_r = link(tp * n, r)
        scatter += volume.replicate_all_reduce / bw_r + units * 2 * math.log2(r) * lat_r
    full = volume.regather > 0
    rounds = volume.rounds
    phases = [(gather, fwd), (scatter + regather, bwd)] * rounds
    offload = 0.0
    if settings.offload:
        copied = rounds * ((2 if full else 1) * p_b + g_b) * psi / n
        offload = (
            copied / (HOST_LINK_GBYTES_PER_SEC * 1e9) + psi / n / HOST_OPTIMIZER_PARAMS_PER_SEC
        )
    return phases, offload
