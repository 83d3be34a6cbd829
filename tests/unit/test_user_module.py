"""A new user's own LightningModule, written from docs/BRING_YOUR_OWN_MODEL.md alone.

The model and module are `examples/byo_model.py`, which the doc shows in full (checked here).
In one process: a pipeline stage cut from a ModuleList iterates like one and keeps the parameter
names (a ModuleDict stays one), the example's TP plan matches every layer, and protocol mistakes
(a forward calling a removed module, bad pipeline attributes, a meta model without init_weights)
stop with one line naming the fix. (The loss-parallel `reduce` and the gloo runs are
tests/dist/test_user_module_dist.py.)
"""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch
from torch import nn

from lightning_dist.layout import Layout
from lightning_dist.models.protocol import require_init_weights
from lightning_dist.parallel.pipeline import StageBlocks, split_blocks, stage_modules
from lightning_dist.strategies.user_path import explain_stage_errors
from tests.repo import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "byo_model.py"
DOC = REPO_ROOT / "docs" / "BRING_YOUR_OWN_MODEL.md"


def _load_example():
    spec = importlib.util.spec_from_file_location("byo_model", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


byo = _load_example()


def tiny(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = byo.TinyLM(vocab=64, width=32, heads=4, depth=4, seq_len=16)
    model.init_weights()
    return model


def _nonblank(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_the_doc_shows_the_example_file_verbatim():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    shown = [line for block in blocks for line in _nonblank(block)]
    assert shown == _nonblank(EXAMPLE.read_text()), (
        "docs/BRING_YOUR_OWN_MODEL.md and examples/byo_model.py differ: the doc's python blocks "
        "must be the file, in order"
    )


# --- pipeline stages of a ModuleList ---------------------------------------------------------


def test_a_stage_cut_from_a_module_list_behaves_like_one():
    whole = tiny()
    tokens = torch.randint(0, 64, (2, 16))
    expected = whole(tokens)
    stages = [stage_modules(tiny(), Layout(pp=2), rank)[0][1] for rank in range(2)]
    first, last = stages
    assert isinstance(last.layers, StageBlocks) and list(last.layers.keys()) == ["2", "3"]
    assert len(last.layers) == 2
    assert [type(layer).__name__ for layer in last.layers] == ["Layer", "Layer"]
    assert last.layers[0] is last.layers["2"] and last.layers[-1] is last.layers["3"]
    assert list(last.layers[0:2]) == list(last.layers)
    assert "3" in last.layers and "0" not in last.layers and last.layers[1] in last.layers
    with pytest.raises(IndexError):
        last.layers[2]
    # Names and state_dict keys are those of the whole model, and the stages compose to it.
    keys = [*first.state_dict(), *last.state_dict()]
    assert sorted(keys) == sorted(whole.state_dict())
    assert "layers.3.attn.query.weight" in last.state_dict()
    torch.testing.assert_close(last(first(tokens)), expected, rtol=1e-5, atol=1e-5)


def test_the_example_tp_plan_matches_every_layer():
    from lightning_dist.parallel.tp import check_tp

    with torch.device("meta"):
        matched = check_tp(byo.TinyLM(vocab=64, width=32, heads=4, depth=4, seq_len=16), 2)
    assert len(matched) == 4 * 6 + 2 and matched["layers.3.mlp.proj"] == "rowwise"


def test_a_module_dict_stays_a_module_dict():
    from lightning_dist.models.args import ModelArgs

    args = ModelArgs(dim=32, n_layers=2, n_heads=4, vocab_size=64, ffn_hidden_size=64)
    stage = stage_modules(args.build(), Layout(pp=2), 1)[0][1]
    assert type(stage.layers) is nn.ModuleDict and list(stage.layers) == ["1"]


# --- protocol mistakes: one line that names the fix ---------------------------------------------


class Unguarded(byo.TinyLM):
    """Calls the embedding on every stage, as a first draft of a forward would."""

    def forward(self, x):
        x = self.tokens(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


class _Pipeline:
    def __init__(self, part):
        self.parts = [part]


def test_a_forward_that_calls_a_removed_module_names_the_fix():
    torch.manual_seed(0)
    model = Unguarded(vocab=64, width=32, heads=4, depth=4, seq_len=16)
    stage = stage_modules(model, Layout(pp=2), 1)[0][1]
    with pytest.raises(TypeError) as err, explain_stage_errors(_Pipeline(stage)):
        stage(torch.randn(2, 16, 32))
    message = str(err.value)
    assert "\n" not in message
    assert "`tokens`, `positions`" in message and "if self.embed is not None" in message
    assert "BRING_YOUR_OWN_MODEL.md" in message
    # Other errors, and code outside a pipeline, pass through unchanged.
    with pytest.raises(ValueError, match="^other$"), explain_stage_errors(_Pipeline(stage)):
        raise ValueError("other")
    with pytest.raises(TypeError, match="^'NoneType' object"), explain_stage_errors(None):
        stage(torch.randn(2, 16, 32))


def _with(**attrs) -> nn.Module:
    model = tiny()
    for name, value in attrs.items():
        setattr(model, name, value)
    return model


@pytest.mark.parametrize(
    "attrs, message",
    [
        (dict(pipeline_first="tokens"), r"TinyLM.pipeline_first must be a tuple .*\('tokens',\)"),
        (dict(pipeline_last=("norm", "lm_head")), "pipeline_last names 'lm_head', which the model"),
        (dict(pipeline_blocks="blocks"), "pipeline_blocks='blocks' is not a submodule path"),
        (dict(pipeline_blocks="head"), "pipeline_blocks='head' is a Linear; it must name"),
    ],
)
def test_pipeline_attribute_mistakes(attrs, message):
    with pytest.raises(ValueError, match=message):
        split_blocks(_with(**attrs), 2)


def test_a_meta_model_without_init_weights():
    class NoInit(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)

    with torch.device("meta"):
        model = NoInit()
    with pytest.raises(ValueError, match=r"NoInit is on the meta device but has no init_weights"):
        require_init_weights(model)
    require_init_weights(NoInit())  # already materialised: nothing to initialise
    with torch.device("meta"):
        require_init_weights(byo.TinyLM(vocab=64, width=32, heads=4, depth=2, seq_len=16))
