"""Language-model data: tokenizers, the token cache, datasets, samplers and datamodules.

Names are imported on first use, so `import lightning_dist.lm` stays cheap (the datamodules
pull in Lightning; the tokenizer and the cache need only numpy).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "ByteTokenizer": "tokenizer",
    "HFTokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
    "TokenCache": "token_cache",
    "build_token_cache": "token_cache",
    "default_cache_dir": "token_cache",
    "resolve_files": "token_cache",
    "SyntheticTokens": "datasets",
    "TokenWindows": "datasets",
    "GlobalBatchSampler": "sampling",
    "batch_plan": "sampling",
    "LMDataModule": "data",
    "MixtureDataModule": "data",
    "MixturePlan": "mixture",
    "SyntheticDataModule": "data",
    "TextDataModule": "data",
}

__all__ = [
    "ByteTokenizer",
    "GlobalBatchSampler",
    "HFTokenizer",
    "LMDataModule",
    "MixtureDataModule",
    "MixturePlan",
    "SyntheticDataModule",
    "SyntheticTokens",
    "TextDataModule",
    "TokenCache",
    "TokenWindows",
    "batch_plan",
    "build_token_cache",
    "default_cache_dir",
    "load_tokenizer",
    "resolve_files",
]

if TYPE_CHECKING:
    from lightning_dist.lm.data import (
        LMDataModule,
        MixtureDataModule,
        SyntheticDataModule,
        TextDataModule,
    )
    from lightning_dist.lm.datasets import SyntheticTokens, TokenWindows
    from lightning_dist.lm.mixture import MixturePlan
    from lightning_dist.lm.sampling import GlobalBatchSampler, batch_plan
    from lightning_dist.lm.token_cache import (
        TokenCache,
        build_token_cache,
        default_cache_dir,
        resolve_files,
    )
    from lightning_dist.lm.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_dist.lm' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"lightning_dist.lm.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
