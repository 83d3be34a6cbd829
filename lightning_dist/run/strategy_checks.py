"""The configured strategy, built and checked before any process starts: against the model
(built on the meta device), the batch, the hardware and every node count of an elastic job.

train.py's plan stage (`run/plan.py`, `plan.only` too) and `python -m lightning_dist.plan` run
these same functions, so both refuse the same settings with the same line.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lightning_dist.config.targets import build
from lightning_dist.contract import contract_of
from lightning_dist.hardware import HardwareSpec
from lightning_dist.layout import Batch, batch_plan
from lightning_dist.run.spec import RunSpec


def build_strategy(
    strategy_cfg: DictConfig,
    hardware: HardwareSpec,
    *,
    collective_timeout_s: float | None = None,
    **overrides: Any,
):
    """Instantiate `conf/strategy/*.yaml` with Hydra. A distributed strategy (its schema
    declares `process_group_backend`) gets the hardware's backend when that is null, and
    `collective_timeout_s` as the timeout of its process groups."""
    if "process_group_backend" in strategy_cfg:
        if strategy_cfg.process_group_backend is None:
            overrides.setdefault("process_group_backend", hardware.backend)
        if collective_timeout_s is not None:
            overrides.setdefault("timeout", timedelta(seconds=collective_timeout_s))
    config = OmegaConf.masked_copy(strategy_cfg, [str(k) for k in strategy_cfg if k != "name"])
    return build(config, "strategy", **overrides, _convert_="all")


def check_built_strategy(
    spec: RunSpec, strategy: Any, batch: Batch, precision: str
) -> tuple[int, int]:
    """The built strategy checked against the model, the batch and the hardware (every node
    count of an elastic job): (devices, num_nodes). The one function behind the strategy checks
    of train.py's plan stage (`plan.only` too) and of `python -m lightning_dist.plan`
    (`check_strategy_settings`)."""
    from lightning_dist.run.checks import check_cpu_capacity

    hardware, trainer = spec.hardware, spec.trainer
    contract = contract_of(strategy)
    if trainer.checkpoint.async_save:
        contract.enable_async_save()
    devices = 1 if contract.single_process else hardware.resolved_devices()
    num_nodes = 1 if contract.single_process else hardware.num_nodes
    if hardware.accelerator == "cpu" and not (spec.plan.only or spec.plan.dry_run):
        check_cpu_capacity(devices, spec.model.num_params())
    if spec.data.get("pack_documents"):
        check_packed_documents(spec.model)
    check_strategy(
        strategy,
        spec.model,
        batch,
        hardware,
        devices=devices,
        num_nodes=num_nodes,
        precision=precision,
    )
    if not contract.single_process and spec.strategy_name != "auto":  # auto plans each round
        check_every_round(
            strategy, spec.model, batch, hardware, devices, precision, node_counts=spec.node_counts
        )
    return devices, num_nodes


def check_strategy_settings(cfg: DictConfig) -> None:
    """For `python -m lightning_dist.plan`: what `train.py ... plan.only=true` checks of the
    configured strategy (`check_built_strategy`), on a config `run.checks.check_config_text`
    passed; ValueError naming the bad value. strategy=auto is skipped: its layout is the one
    the planner's table chooses."""
    from lightning_dist.run.checks import resolve_precision

    cfg = cfg.copy()
    cfg.paths.output_dir = "."  # its default names Hydra's run folder; these checks write none
    spec = RunSpec.of(cfg, choices={})
    if spec.strategy_name == "auto":
        return
    spec = replace(spec, plan=replace(spec.plan, only=True))
    hardware = spec.hardware
    precision = resolve_precision(
        spec.trainer.precision or hardware.precision, hardware.accelerator
    )
    strategy = build_strategy(
        spec.strategy, hardware, collective_timeout_s=spec.trainer.collective_timeout_s
    )
    check_built_strategy(spec, strategy, spec.batch, precision)


def check_strategy(
    strategy: Any,
    model: Any,
    batch: Batch,
    hardware: HardwareSpec,
    *,
    devices: int,
    num_nodes: int,
    precision: str,
    notes: bool = True,
) -> None:
    """The strategy's own checks of the whole run: world size, precision, accelerator, batch
    split, the model's classes (built on the meta device), the sequence's cut into
    context-parallel chunks, and the layers float8 converts (with `notes`, one warning line
    when it leaves some out)."""
    import torch

    from lightning_dist.parallel.float8 import check_float8_layers
    from lightning_dist.runtime.console import warn_once

    with torch.device("meta"):
        built = model.build()
    float8_note = check_float8_layers(built, contract_of(strategy).options.float8.float8)
    if float8_note and notes:
        warn_once(float8_note)
    contract_of(strategy).check_run(
        devices=devices,
        num_nodes=num_nodes,
        model=built,
        precision=precision,
        accelerator=hardware.accelerator,
        global_batch_size=batch.global_batch_size,
        micro_batch_size=batch.micro_batch_size,
    )
    contract_of(strategy).layout_for(devices, num_nodes).check_sequence(batch.seq_len)


def check_packed_documents(model: Any) -> None:
    """ValueError in one line unless the model (built on the meta device) keeps attention
    inside each packed document: its `forward` takes `documents` (`takes_documents`)."""
    import torch

    with torch.device("meta"):
        built = model.build()
    if not getattr(built, "takes_documents", False):
        raise ValueError(
            f"data.pack_documents=true needs a model that keeps attention inside each document "
            f"(forward(tokens, positions, documents), as lightning_dist's Transformer); "
            f"{type(built).__name__} takes no document mask: use data.pack_documents=false"
        )


def check_every_round(
    strategy: Any,
    model: Any,
    batch: Batch,
    hardware: HardwareSpec,
    devices: int,
    precision: str,
    *,
    node_counts: tuple[int, ...],
) -> None:
    """An elastic job runs on any of `node_counts` (hardware.min_nodes to num_nodes): in every
    round, before step 1, `check_strategy` for the counts other than this round's, so that a
    layout that a later round could not hold stops the first one, with the count named."""
    for nodes in node_counts:
        if nodes == hardware.num_nodes:
            continue  # this round's: checked already
        try:
            check_strategy(
                strategy,
                model,
                batch,
                hardware,
                devices=devices,
                num_nodes=nodes,
                precision=precision,
                notes=False,
            )
            contract = contract_of(strategy)
            shares = contract.data_shares(contract.layout_for(devices, nodes))
            batch_plan(batch.global_batch_size, shares, batch.micro_batch_size)
        except ValueError as e:
            raise ValueError(
                f"an elastic round on {nodes} of hardware.min_nodes={node_counts[0]} to "
                f"hardware.num_nodes={node_counts[-1]} nodes fails: {e}; raise "
                "hardware.min_nodes, or pick a layout that every node count in that range can "
                "hold"
            ) from e
