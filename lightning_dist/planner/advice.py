"""What to do when communication outweighs compute: the sources' rule keeps communication under
30% of compute; over it (a slow link between nodes or sites), the planner times the same layout
with the gradient traffic cut (compression, DiLoCo) and says what each would give. Each option's
loss cost is measured on the CPU default task, not predicted (docs/SLOW_LINKS.md).
"""

from __future__ import annotations

from dataclasses import replace

from lightning_dist.planner.labels import strategy_name
from lightning_dist.planner.settings import REPLICATED_MODES

COMM_COMPUTE_RULE = 0.3
"""Communication over compute above which a run is link-bound (the sources' 30% rule)."""

DDP_OPTIONS = (
    {"grad_compression": "bf16", "diloco_inner_steps": 0},
    {"grad_compression": "powersgd", "diloco_inner_steps": 0},
    {"diloco_inner_steps": 8, "diloco_outer_lr": 1.0, "diloco_outer_momentum": 0.0,
     "grad_compression": "none"},
)  # fmt: skip
"""The gradient-traffic options of `strategy=ddp` the advice times (`options/speed.py`). DiLoCo
comes with the outer step that held its loss at 8 inner steps (plain averaging: +1.6% against
DDP after 400 steps, where the paper's lr 0.7 with Nesterov 0.9, tuned for hundreds of inner
steps, lost 14%; docs/SLOW_LINKS.md). Each option also turns the others off (compression and
DiLoCo exclude each other); the advice prints only the knobs it changes."""


def slow_link_advice(model, hardware, candidate, *, evaluate) -> list[str]:
    """Lines for a candidate over COMM_COMPUTE_RULE: each traffic option of its strategy,
    timed by `evaluate(settings)` (a Candidate), with its predicted tokens/s and gain; none
    under the rule or with no data parallelism to cut."""
    t, lay, st = candidate.time, candidate.layout, candidate.settings
    if t.comm_compute_ratio <= COMM_COMPUTE_RULE or lay.dp == 1 or not t.dp_comm_seconds:
        return []
    lines = [
        f"note: communication is {t.comm_compute_ratio:.0%} of compute, over the 30% rule; "
        "the same layout with less gradient traffic:"
    ]
    if strategy_name(lay, st) == "ddp":  # the strategy with these knobs (options/presets.py)
        options = DDP_OPTIONS
    elif st.sharding not in REPLICATED_MODES and st.gradient_reduce_bytes > 2:
        options = ({"reduce_dtype": "bf16"},)
    else:
        options = ()
    before = st.options.knobs()
    for knobs in options:
        after = st.options.with_knobs(**knobs)
        other = evaluate(replace(st, options=after))
        gain = other.time.tokens_per_sec / t.tokens_per_sec - 1
        changed = {k: v for k, v in after.knobs().items() if k in knobs and before.get(k) != v}
        setting = " ".join(f"strategy.{k}={v}" for k, v in changed.items())
        lines.append(
            f"  {setting}: {other.time.tokens_per_sec:,.0f} tokens/s predicted "
            f"({gain:+.0%}), comm/compute {other.time.comm_compute_ratio:.2f}"
        )
    if options:
        lines.append("  (their loss cost is measured, not predicted: docs/SLOW_LINKS.md)")
    return lines
