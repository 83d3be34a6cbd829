"""A model without the pipeline-layers contract, for the error-path tests of train.py.

Select it with `model=llama_debug model._target_=tests.plain_model.PlainArgs`.
"""

from __future__ import annotations

from torch import nn

from lightning_dist.models.args import ModelArgs
from lightning_dist.models.llama import Transformer


class WrappedTransformer(nn.Module):
    """Our Transformer one level down: no `pipeline_*` attributes, so it cannot be cut."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.inner = Transformer(args)

    def forward(self, tokens):
        return self.inner(tokens)

    def init_weights(self, buffer_device=None) -> None:
        self.inner.init_weights(buffer_device)


class PlainArgs(ModelArgs):
    """ModelArgs whose `build()` gives the wrapped model."""

    def build(self):
        return WrappedTransformer(self)
