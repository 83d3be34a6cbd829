"""The expert load of a mixture-of-experts run, step by step: what `CausalLM` logs (to the
metrics CSV and W&B) and what summary.json's `moe` key holds (docs/MOE.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(kw_only=True)
class ExpertStats:
    """Each optimizer step's expert loads and auxiliary loss, over every rank."""

    layers: tuple[int, ...]
    """The MoE layers' block indices."""
    top_k: int
    active_parameters: int
    aux_losses: list[float | None] = field(default_factory=list)
    """The load-balancing loss of each step (mean over micro-batches and ranks, like the LM
    loss, and summed over the layers); None where `model.aux_loss_coeff=0`."""
    imbalance: list[list[float]] = field(default_factory=list)
    """Each step's max / mean of the tokens per expert, for each MoE layer (1: balanced)."""
    fractions: list[list[float]] = field(default_factory=list)
    """The last step's share of the routed tokens of each expert, for each MoE layer."""

    @classmethod
    def of(cls, spec: Any) -> ExpertStats:
        """For the model described by `spec` (`MoEArgs`)."""
        return cls(
            layers=tuple(spec.moe_layers), top_k=spec.top_k, active_parameters=spec.active_params()
        )

    def record(self, loads: torch.Tensor, aux_loss: float | None) -> dict[str, float]:
        """Keep one step: `loads` [n_layers, num_experts], any positive multiple of the step's
        tokens per expert (only shares are read); return the metrics to log."""
        rows = loads[list(self.layers)].double()
        imbalance = (rows.max(-1).values / rows.mean(-1)).tolist()
        self.fractions = (rows / rows.sum(-1, keepdim=True)).tolist()
        self.imbalance.append(imbalance)
        self.aux_losses.append(aux_loss)
        metrics = {"moe/imbalance": max(imbalance)}
        layers = zip(self.layers, imbalance, strict=True)
        metrics |= {f"moe/imbalance_layer{i}": v for i, v in layers}
        if aux_loss is not None:
            metrics["train/aux_loss"] = aux_loss
        return metrics

    def summary(self, tokens_per_step: int) -> dict[str, Any]:
        """summary.json's `moe`: `tokens_per_step` is the global batch's tokens."""
        steps = len(self.imbalance)
        mean = [sum(step[j] for step in self.imbalance) / steps for j in range(len(self.layers))]
        routed = self.top_k * tokens_per_step
        return {
            "layers": list(self.layers),
            "top_k": self.top_k,
            "active_parameters": self.active_parameters,
            "aux_losses": self.aux_losses,
            "final_aux_loss": self.aux_losses[-1] if self.aux_losses else None,
            "tokens_per_expert": [[round(f * routed) for f in row] for row in self.fractions],
            "imbalance": self.imbalance[-1] if steps else [],
            "mean_imbalance": mean if steps else [],
            "max_imbalance": max(self.imbalance[-1]) if steps else None,
        }
