"""The two small contracts a model keeps so that parallelism can be applied from outside.

Both are plain class attributes, so a model stays single-device code and needs no import from
`lightning_dist.parallel`. Our `Transformer` and the Hugging Face wrapper `HFCausalLM` implement
both; a user's own model can too (see docs/BRING_YOUR_OWN_MODEL.md).

**Tensor-parallel plan** (`tp_plan`): a dict from module-name pattern to a style name. `*` matches
one name segment. The styles are

- `"embedding"`: vocabulary-parallel embedding (rows split across tp ranks);
- `"colwise"` / `"rowwise"`: Megatron's column- and row-parallel linear layers;
- `"colwise_fused(n)"`: a fused projection, one `nn.Linear` whose output is n tensors side by
  side (nanoGPT's `c_attn`/`qkv` = q, k, v: n=3; a `gate_up`: n=2). Each of the n parts is split
  column-wise, so rank r holds the r-th slice of every part and the module's `.chunk(n, -1)`
  gives this rank's slices of q, k and v. Plain `"colwise"` on such a layer is wrong math: it
  splits the whole output, so a rank gets all of q and half of k instead of half of each;
- `"output"`: vocabulary-parallel output projection (the logits stay split for the
  loss-parallel cross-entropy, or are gathered when loss parallelism is off);
- `"norm"`: a norm run on sequence shards under sequence parallelism (ignored without it);
- `"sp_input"`: a sub-block whose first input is gathered from sequence shards under sequence
  parallelism (ignored without it).

A plan without `"norm"` entries cannot run sequence parallelism. Users may also pass torch
`ParallelStyle` objects in their own plan.

**Pipeline layers** (`pipeline_blocks`, `pipeline_first`, `pipeline_last`): where to cut.

- `pipeline_blocks`: dotted path of the `nn.ModuleList` (or `nn.ModuleDict`) of repeated blocks,
  run in order. A stage keeps a contiguous range of them under their original indices, so
  parameter names do not change. Cut from a ModuleList, the kept blocks still iterate, index and
  `len()` like a ModuleList (`for layer in self.layers:` runs this stage's layers); cut from a
  ModuleDict they stay a ModuleDict of the kept keys.
- `pipeline_first`: dotted paths of the modules only the first stage keeps (the embedding).
- `pipeline_last`: dotted paths of the modules only the last stage keeps (final norm, output).
- `forward(x)` accepts token ids or the previous stage's hidden states (when the
  `pipeline_first` modules are None), runs whatever blocks are left, and returns hidden states
  when the `pipeline_last` modules are None. Every stage returns a single tensor.

**Output head** (`output_head`, optional): dotted path of a bias-free `nn.Linear` that maps the
final hidden states to logits. A chunked loss (`model.loss_chunk_tokens`,
`lightning_dist.lm.chunked_loss`) makes it return its input and applies its weight itself, a
chunk of tokens at a time; models without it keep the plain loss.

**Packed documents** (`takes_documents`, optional): True when `forward(tokens, positions,
documents)` takes each token's rotary position and document id ([b, s]) and keeps attention
inside each document (`models/documents.py`); `data.pack_documents=true` refuses other models.

**Initialisation** (`init_weights()`): a model built on the meta device gets its storage from
`to_empty()` and its values from `init_weights()`, which must set every parameter and buffer in
place (see `require_init_weights`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import nn

TP_STYLES = ("embedding", "colwise", "colwise_fused(n)", "rowwise", "output", "norm", "sp_input")
"""The style names of a plan; `colwise_fused(n)` is written with its number of parts, e.g.
`"colwise_fused(3)"`."""


@runtime_checkable
class PipelineLayers(Protocol):
    """A model that can be cut into pipeline stages by block ranges (see the module docs)."""

    pipeline_blocks: str
    pipeline_first: tuple[str, ...]
    pipeline_last: tuple[str, ...]


def require_init_weights(model: nn.Module) -> None:
    """Raise ValueError (one line naming the fix) when `model` holds meta tensors but has no
    `init_weights()` to give them values after `to_empty()`."""
    if callable(getattr(model, "init_weights", None)):
        return
    if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        raise ValueError(
            f"{type(model).__name__} is on the meta device but has no init_weights(): add a method "
            "that initialises every parameter and buffer in place (e.g. calls reset_parameters() "
            "on each submodule); see docs/BRING_YOUR_OWN_MODEL.md"
        )
