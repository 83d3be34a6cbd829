"""Does the loader keep up? The planner's tokens/s for a run against what its data loaders
can read, from a table measured by `bench/data_throughput.py --loader`
(`lightning_dist/data/loader_rates.json`: tokens/s of one DataLoader worker per source format).

Every data-parallel rank reads its own part of each global batch, so each rank's loader must
deliver `tokens_per_sec / dp`; with `data.num_workers=n` it reads up to n times one worker's rate
(0, loading in the training process, counts as one, and takes the step's own time). A mixture
reads each source at its weight's share, so its rate is the weighted harmonic mean. Reading a
small JSON file is all the check costs at startup.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

TABLE = "loader_rates.json"


@cache
def loader_rates() -> dict[str, float]:
    """Tokens/s of one loader worker per source format (`jsonl.zst` apart from `jsonl`)."""
    text = resources.files("lightning_dist.data").joinpath(TABLE).read_text()
    return {k: float(v) for k, v in json.loads(text)["formats"].items()}


def _format_key(source: Mapping[str, Any]) -> str:
    if source.get("stream"):
        return "streamed"
    fmt = str(source.get("format") or "text")
    path = source.get("path")
    paths = [path] if isinstance(path, str) else list(path or [])
    return f"{fmt}.zst" if fmt == "jsonl" and any(str(p).endswith(".zst") for p in paths) else fmt


def worker_rate(
    sources: Sequence[Mapping[str, Any]], rates: Mapping[str, float], dp: int = 1
) -> float | None:
    """Tokens/s of its own samples one loader worker of one of `dp` data-parallel ranks reads
    from this mixture (None: a format the table lacks). A streamed source is tokenized whole
    on every rank (`lm/streaming.py`): each of its samples costs a rank dp samples' work."""
    weights = [float(s.get("weight", 1.0)) for s in sources]
    keys = [_format_key(s) for s in sources]
    if not sources or any(k not in rates for k in keys):
        return None
    total = sum(weights)
    cost = [
        w * (max(dp, 1) if k == "streamed" else 1) / rates[k]
        for w, k in zip(weights, keys, strict=True)
    ]
    return total / sum(cost)


def keep_up_warning(
    data: Mapping[str, Any],
    tokens_per_sec: float | None,
    dp: int,
    rates: Mapping[str, float] | None = None,
) -> str | None:
    """One line when the loaders are predicted to fall behind the devices, naming the
    `data.num_workers` that would keep up; None when they keep up or nothing is known."""
    if not tokens_per_sec or "_target_" not in data or "Synthetic" in str(data["_target_"]):
        return None
    sources = data.get("sources") or [{"format": "text", "path": data.get("paths")}]
    rate = worker_rate(sources, loader_rates() if rates is None else rates, dp)
    if rate is None:
        return None
    need = tokens_per_sec / max(dp, 1)
    workers = int(data.get("num_workers") or 0)
    if need <= rate * max(workers, 1):
        return None
    enough = math.ceil(need / rate)
    return (
        f"the data loaders may not keep up: the plan consumes {tokens_per_sec:,.0f} tokens/s, "
        f"{need:,.0f} per data-parallel rank (dp={dp}), and one loader worker reads about "
        f"{rate:,.0f} tokens/s of these sources (lightning_dist/data/loader_rates.json); "
        f"set data.num_workers={enough} (now {workers})"
    )
