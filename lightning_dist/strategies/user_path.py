"""What `Parallel3DStrategy` does so that a user's own LightningModule needs no DTensor knowledge.

Used by the strategy's hooks (the detached plain copy of a loss-parallel DTensor that the strategy
reduces and logs is `parallel/tp.py:plain_tensor`):

- `explain_stage_errors`: a pipeline stage holds None in place of the modules of other stages;
  a forward that calls them anyway fails deep inside the schedule. This turns that failure into
  one line naming the fix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

STAGE_HINT = (
    "under pipeline parallelism every stage but the first holds None in place of {first}, and "
    "every stage but the last None in place of {last}: forward must skip the ones that are None "
    "(`if self.embed is not None: x = self.embed(x)`), take the previous stage's hidden states "
    "as input and return hidden states; see docs/BRING_YOUR_OWN_MODEL.md"
)


@contextlib.contextmanager
def explain_stage_errors(pipeline) -> Iterator[None]:
    """Re-raise a stage forward's call of a removed module as one line naming the fix.

    `pipeline` is the strategy's `PipelinedModel`, or None (then this does nothing). Only the
    errors Python raises for using None as a module ("'NoneType' object is not callable" or
    "... has no attribute") are rewritten; the original stays chained below.
    """
    try:
        yield
    except (TypeError, AttributeError) as err:
        if pipeline is None or "'NoneType' object" not in str(err):
            raise
        part = pipeline.parts[0]
        hint = STAGE_HINT.format(
            first=_names(getattr(part, "pipeline_first", ())),
            last=_names(getattr(part, "pipeline_last", ())),
        )
        raise type(err)(f"{err}: {hint}") from err


def _names(paths) -> str:
    return ", ".join(f"`{p}`" for p in paths) or "nothing"
