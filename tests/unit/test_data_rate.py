"""Does the loader keep up? (lightning_dist/run/data_rate.py): the checked-in table covers every
source format, and the warning names the data.num_workers that would keep up."""

from __future__ import annotations

import math

from lightning_dist.options.data import SOURCE_FORMATS
from lightning_dist.run.data_rate import keep_up_warning, loader_rates, worker_rate

MIXTURE = "lightning_dist.lm.data.MixtureDataModule"


def test_the_table_has_a_rate_for_every_format():
    rates = loader_rates()
    assert set(SOURCE_FORMATS) | {"jsonl.zst"} <= set(rates)
    assert all(rate > 0 for rate in rates.values())


def test_the_warning_names_the_workers_that_keep_up():
    rates = {"jsonl": 1000.0, "jsonl.zst": 500.0, "tokens": 4000.0}
    sources = [
        {"path": "a/*.jsonl.zst", "format": "jsonl", "weight": 0.5},
        {"path": "b.bin", "format": "tokens", "weight": 0.5},
    ]
    rate = worker_rate(sources, rates)
    assert rate is not None and math.isclose(rate, 1 / (0.5 / 500 + 0.5 / 4000))
    data = {"_target_": MIXTURE, "sources": sources, "num_workers": 2}
    # 8 data-parallel ranks at 40,000 tokens/s: 5,000 per rank, 2 workers read ~1,778.
    line = keep_up_warning(data, 40_000, 8, rates)
    assert line is not None and "5,000 per data-parallel rank (dp=8)" in line
    assert line.endswith(f"set data.num_workers={math.ceil(5000 / rate)} (now 2)")
    assert keep_up_warning(data, 1_000, 8, rates) is None  # keeps up
    assert keep_up_warning(data, None, 8, rates) is None  # no prediction (CPU)
    synthetic = {"_target_": "lightning_dist.lm.data.SyntheticDataModule", "num_workers": 0}
    assert keep_up_warning(synthetic, 10**9, 1, rates) is None
    # Streamed: every rank tokenizes the source whole, so dp ranks do not divide its work.
    streamed = [{"path": "a/*.jsonl", "format": "jsonl", "stream": True}]
    assert worker_rate(streamed, {"streamed": 800.0}, dp=8) == 100.0
    assert worker_rate(streamed, rates) is None  # a table without the streamed rate
    text = {"_target_": "lightning_dist.lm.data.TextDataModule", "paths": None, "num_workers": 0}
    assert "set data.num_workers=" in (keep_up_warning(text, 10**12, 1) or "")
