"""`strategy=ft_hsdp` / `Trainer(strategy="ft_hsdp")`: replica groups that heal live.

The mesh strategy (FSDP2 over the ranks of one group; tp and pp as in `3d`) inside each replica
group, and torchft across them (`cluster/replica_groups.py`): start the job with
`python -m lightning_dist.launch replicas --groups N --nproc-per-group M <overrides>`. What the
strategy adds to `Parallel3DStrategy`:

- before each step's forward, a quorum of the groups present (the first one in `setup`, where a
  relaunched group heals: the model, the optimizer and scheduler state, Lightning's loop
  counters and the data position of a peer);
- after backward, the gradient shards (and the step's loss) averaged over the groups of the
  quorum; a step whose cross-group all-reduce failed on any rank of the group is not committed:
  it runs again on the same batch with the groups still present. Every optimizer step is thus
  taken exactly once, from the samples of the groups present at its commit: a missing group's
  share of the global batch is not trained on for those steps (never repeated later).
  summary.json records the groups of every step (`replica_groups_per_step`);
- the data split over every group's ranks: group g's rank r reads the data-parallel share
  `g * dp + r` of `groups * dp`.

Gradient accumulation is refused (a retried step reruns only its last micro-batch).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lightning_dist.checkpoint.manifest import MANIFEST
from lightning_dist.cluster.elastic import restart_attempt
from lightning_dist.cluster.replica_groups import (
    LIGHTHOUSE_ENV,
    LighthouseLost,
    ReplicaGroupFellBehind,
    ReplicaGroupLeftBehind,
    ReplicaGroups,
    check_lighthouse,
    load_training_state,
    local_tensor,
    replica_group_id,
    training_state,
)
from lightning_dist.layout import Layout, batch_plan
from lightning_dist.runtime.strategy_names import register_strategies
from lightning_dist.strategies.parallel3d import Parallel3DStrategy

log = logging.getLogger(__name__)


class FTHSDPStrategy(Parallel3DStrategy):
    """FSDP2 inside each replica group, torchft across groups (`strategy.replica_groups`)."""

    strategy_name = "ft_hsdp"
    preset = "ft_hsdp"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._replicas: ReplicaGroups | None = None
        self._quorum_ready = False  # the next step's quorum was formed in setup()
        self._in_setup = False
        self._loss_across = torch.zeros(())
        self.groups_per_step: list[int] = []
        self.healed_at_step: int | None = None

    # --- the contract -------------------------------------------------------------------------

    @property
    def group_count(self) -> int:
        return self.options.replicas.replica_groups

    @functools.cached_property
    def group_id(self) -> int:
        """This process's replica group, from the launcher's environment (read once)."""
        return replica_group_id(self.group_count)

    def layout_for(self, devices: int, num_nodes: int) -> Layout:
        layout = super().layout_for(devices, num_nodes)
        if layout.dp_replicate != 1:
            raise ValueError(
                f"strategy=ft_hsdp replicates across groups (strategy.replica_groups); "
                f"strategy.dp_replicate={layout.dp_replicate} must be 1 inside a group"
            )
        return layout

    def check_run(
        self,
        *,
        global_batch_size: int | None = None,
        micro_batch_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        if importlib.util.find_spec("torchft") is None:
            raise ValueError(
                "strategy=ft_hsdp needs torchft: pip install 'lightning_dist[ft]' (torchft 0.2.0)"
            )
        experts = getattr(getattr(kwargs.get("model"), "args", None), "num_experts", 0)
        if experts:
            # CausalLM sums the expert loads over one group's ranks, not across the groups.
            raise ValueError(
                f"strategy=ft_hsdp with a mixture of experts (model.num_experts={experts}) is "
                "not supported yet; use strategy=fsdp2 or ddp"
            )
        if global_batch_size is None:
            super().check_run(**kwargs)
            return
        layout = self.layout_for(kwargs["devices"], kwargs["num_nodes"])
        shares = self.data_shares(layout)
        micro, accumulation = batch_plan(global_batch_size, shares, micro_batch_size)
        if accumulation > 1:
            raise ValueError(
                f"strategy=ft_hsdp takes no gradient accumulation: data.global_batch_size="
                f"{global_batch_size} over {shares} data-parallel ranks "
                f"({self.group_count} groups x {layout.dp}) needs {accumulation} micro-batches "
                f"of {micro}; set data.per_rank_batch_size={global_batch_size // shares}"
            )
        # Each group trains its share of the batch: the mesh strategy's own checks on it.
        super().check_run(
            global_batch_size=global_batch_size // self.group_count,
            micro_batch_size=micro_batch_size,
            **kwargs,
        )

    def check_environment(self) -> None:
        replica_group_id(self.group_count)  # started by the launcher
        check_lighthouse(os.environ[LIGHTHOUSE_ENV])  # and its Lighthouse is up

    def heals_from_peer(self) -> bool:
        # Relaunched by its torchrun into a running job: the peers hold newer state than the
        # group's own checkpoint (a whole-job restart starts new torchruns, count 0, and resumes).
        return restart_attempt() > 0

    def data_shares(self, layout: Layout) -> int:
        return self.group_count * layout.dp

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        layout = self.layout
        return {
            "num_replicas": self.group_count * layout.dp,
            "rank": self.group_id * layout.dp + layout.dp_rank(self.global_rank),
        }

    # --- quorum, healing ----------------------------------------------------------------------

    def setup(self, trainer) -> None:
        from lightning.pytorch.trainer.states import TrainerFn

        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        if trainer.accumulate_grad_batches > 1:
            raise ValueError("strategy=ft_hsdp takes no gradient accumulation (see check_run)")
        if not self.lightning_module.automatic_optimization or len(self.optimizers) != 1:
            raise ValueError(
                "strategy=ft_hsdp runs Lightning's automatic optimization with one optimizer "
                "(a step that does not commit is rerun through its closure)"
            )
        opts = self.options.replicas
        self._replicas = ReplicaGroups(
            group_id=self.group_id,
            groups=opts.replica_groups,
            min_groups=opts.min_replica_groups,
            timeout_s=opts.ft_timeout_s,
            state_fn=self._state,
            load_fn=self._load,
        )
        self._in_setup = True
        try:
            present = self._replicas.first_quorum()
        finally:
            self._in_setup = False
        self._quorum_ready = True
        if self.healed_at_step is not None:
            log.warning(
                "Replica group %d healed from a peer at step %d (%d groups present)",
                self._replicas.group_id,
                self.healed_at_step,
                present,
            )

    def _state(self) -> dict[str, Any]:
        """What a healing peer receives (torchft calls this on its quorum thread, while the
        main thread waits for the quorum at the start of a step)."""
        trainer = self.lightning_module.trainer
        return {
            "shards": training_state(self.model, self.optimizers[0]),
            "loops": trainer.fit_loop.state_dict(),
            "schedulers": [c.scheduler.state_dict() for c in self.lr_scheduler_configs],
            "datamodule": dict(trainer.datamodule.state_dict()) if trainer.datamodule else {},
        }

    def _load(self, state: dict[str, Any]) -> None:
        if not self._in_setup:
            raise ReplicaGroupFellBehind(
                f"replica group {self._replicas.group_id} fell behind the others and must heal "
                "from a peer: it restarts (torchrun --max-restarts) and heals before its first step"
            )
        trainer = self.lightning_module.trainer
        load_training_state(self.model, self.optimizers[0], state["shards"])
        trainer.fit_loop.load_state_dict(state["loops"])
        for config, saved in zip(self.lr_scheduler_configs, state["schedulers"], strict=True):
            config.scheduler.load_state_dict(saved)
        if trainer.datamodule is not None and state["datamodule"]:
            trainer.datamodule.load_state_dict(state["datamodule"])
        self.healed_at_step = trainer.global_step  # from the loops just loaded

    # --- steps --------------------------------------------------------------------------------

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self._quorum_ready:  # this process's first step: its quorum was formed in setup()
            # A resumed run restored its step after setup: count torchft's steps from there.
            self._replicas.set_step(self.lightning_module.trainer.global_step)
        else:
            try:
                self._replicas.quorum()
            except (LighthouseLost, ReplicaGroupLeftBehind):
                self._save_before_stopping()
                raise
        self._quorum_ready = False
        return super().training_step(*args, **kwargs)

    def _save_before_stopping(self) -> None:
        """The Lighthouse is lost (or the group was left behind) at this step's quorum, before its
        forward: every rank of the group failed the same quorum and holds the state of the last
        step it committed. Save that step, unless a rank sees it saved already, so that no
        trained step is lost."""

        module = self.lightning_module
        trainer = module.trainer if module is not None else None
        folder = getattr(getattr(trainer, "checkpoint_callback", None), "dirpath", None)
        if trainer is None or folder is None or trainer.global_step == 0:
            return
        path = Path(folder) / f"step{trainer.global_step}.ckpt"
        saved = torch.tensor([float((path / MANIFEST).is_file())], device=self.root_device)
        dist.all_reduce(saved, op=dist.ReduceOp.MAX)  # the group's ranks decide alike
        if not saved.item():
            trainer.save_checkpoint(path, weights_only=False)

    def optimizer_step(self, optimizer, closure, model=None, **kwargs: Any) -> Any:
        """Backward, then the cross-group average and commit; a step not committed runs again
        on the same batch (a new quorum first), so each step is taken exactly once."""
        replicas = self._replicas

        def closure_until_committed():
            step = self.lightning_module.trainer.global_step
            for attempt in range(1, 101):
                loss = closure()
                grads = [
                    local_tensor(p.grad)
                    if p.grad is not None
                    else torch.zeros_like(local_tensor(p))  # absent here, maybe not elsewhere
                    for p in self.model.parameters()
                    if p.requires_grad
                ]
                device = grads[0].device if grads else torch.device("cpu")
                mine = torch.zeros((), device=device) if loss is None else loss.detach().float()
                # The loss and the step ride along with the gradients: the step checks that
                # every group of the quorum trains the same step (groups resumed from
                # different checkpoints do not).
                extras = torch.stack(
                    [mine.to(device).reshape(()), torch.tensor(float(step), device=device)]
                )
                replicas.average([*grads, extras])
                mean_step = float(extras[1])
                problem = None if mean_step == step else f"groups at steps averaging {mean_step}"
                if replicas.commit(problem):
                    self._loss_across = extras[0]
                    self.groups_per_step.append(replicas.participants())
                    return loss
                if mean_step > step:  # this group is behind the others: it heals by restarting
                    raise ReplicaGroupFellBehind(
                        f"replica group {replicas.group_id} is at step {step}, behind the other "
                        f"groups (their mean step {mean_step}); it restarts and heals from them"
                    )
                log.warning(
                    "Replica group %d: step %d not committed (attempt %d: %s); running it again "
                    "with the groups present",
                    replicas.group_id,
                    step + 1,
                    attempt,
                    problem or "a group failed during it",
                )
            raise RuntimeError(f"step {step + 1} failed to commit 100 times")

        return super().optimizer_step(optimizer, closure_until_committed, model, **kwargs)

    def mean_over_replica_groups(self, local: torch.Tensor) -> torch.Tensor:
        """This rank's loss of the step, averaged over the replica groups that committed it
        (all-reduced with the gradients); `local` is this rank's own value."""
        return self._loss_across.to(local.device, local.dtype)

    def summary_fields(self) -> dict[str, Any]:
        """summary.json keys: the group, the groups present at each step, and where it healed."""
        return {
            "replica_group": self.group_id,  # the manager is gone by then (teardown)
            "replica_groups": self.group_count,
            "replica_groups_per_step": list(self.groups_per_step),
            "healed_at_step": self.healed_at_step,
        }

    def teardown(self) -> None:
        if self._replicas is not None:
            self._replicas.shutdown()
            self._replicas = None
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(
            "ft_hsdp", cls, description="FSDP2 replica groups that heal live (torchft)"
        )


register_strategies()  # this module's names too, when it was the first to import Lightning
