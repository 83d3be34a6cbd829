"""The optimizer settings (`optim.*`): each declared once, with `knob()`, validated here with the
bad value named as `optim.<field>`. The Hydra schema `OptimSchema` is generated from this class
(config/schemas.py), `CausalLM` takes it whole (lm/module.py). Plain Python, like the strategy
option classes."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_dist.options.knobs import knob


@dataclass(frozen=True, kw_only=True)
class OptimOptions:
    """AdamW over the matrices with weight decay (norm weights and biases without), a linear
    warm-up, then a cosine decay to `lr x min_lr_ratio` at `trainer.max_steps`."""

    lr: float = knob(
        3e-3,
        "Peak learning rate, reached after warmup_steps; 0 or more (0 trains "
        "nothing and only warns).",
    )
    min_lr_ratio: float = knob(
        0.1,
        "The cosine schedule decays to lr x min_lr_ratio at trainer.max_steps; between 0 and 1.",
    )
    warmup_steps: int = knob(20, "Optimizer steps of the linear warm-up from 0 to lr.")
    weight_decay: float = knob(0.1, "AdamW's decoupled weight decay of the matrices; 0 or more.")
    betas: list[float] = knob([0.9, 0.95], "AdamW's two moment decays, each in [0, 1).")
    eps: float = knob(1e-8, "AdamW's epsilon, added to the second moment's root; above 0.")

    def __post_init__(self) -> None:
        rules = (
            ("lr", self.lr >= 0, "0 or more (e.g. optim.lr=3e-3)"),
            ("warmup_steps", self.warmup_steps >= 0, "0 or more"),
            ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1, "between 0 and 1"),
            ("weight_decay", self.weight_decay >= 0, "0 or more"),
            ("eps", self.eps > 0, "above 0"),
            ("betas", len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
             "two values in [0, 1)"),
        )  # fmt: skip
        for name, ok, requirement in rules:
            value = getattr(self, name)
            if not ok:
                shown = list(value) if name == "betas" else value
                raise ValueError(f"optim.{name}={shown} must be {requirement}")
