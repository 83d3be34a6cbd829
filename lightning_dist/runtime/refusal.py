"""A refusal: a configuration the project will not run, reported as one line `error: ...`.

train.py reports its refusals itself (`run.errors.ConfigError`, a `Refusal`). A user's own
script (`L.Trainer(strategy=Parallel3DStrategy(...)).fit(...)`) has no such handler: a refusal
raised after Lightning's launcher has started the ranks (the layout against the world size, the
model against the layout) would reach Python's top level in every rank, a traceback each.
`install_refusal_hook`, called when one of our strategies is built (so in every rank: Lightning's
launcher starts the others by running the script again), has Python report an unhandled
`Refusal` as one line, from global rank 0 only (a refusal checks the configuration, which every
rank shares, so each rank refuses alike), and end the process with exit status 2. Every other
exception keeps Python's own report; a refusal the script catches is the script's.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from lightning_dist.runtime.console import launch_rank_zero, print_line
from lightning_dist.runtime.redaction import redact_text

REFUSAL_EXIT_CODE = 2


class Refusal(ValueError):
    """A configuration or machine problem, reported as one line before training starts."""


class ConfigError(Refusal):
    """A configuration or machine problem found by train.py, reported as one line before
    training starts (`run.errors.report_config_error`). Defined on this floor so that the data
    readers (`data/`) raise it without importing the run's floor."""


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """Re-raise a ValueError of the checks run inside as a `Refusal` (with it as the cause):
    the checks raise ValueError with one line naming the bad value."""
    try:
        yield
    except Refusal:
        raise
    except ValueError as e:
        raise Refusal(str(e)) from e


def refusal_line(error: BaseException) -> str:
    """`error: <the message on one line>`, with secrets redacted."""
    return "error: " + redact_text(" ".join(str(error).split()))


def end_with_refusal(error: Refusal) -> None:
    """Its one line from rank 0, then exit status 2 (see the module doc). Never returns."""
    from lightning_dist.runtime.process_end import end_process

    if launch_rank_zero():
        print_line(refusal_line(error))
    end_process(REFUSAL_EXIT_CODE)


def install_refusal_hook() -> None:
    """Have Python's hook for unhandled exceptions end a `Refusal` with `end_with_refusal`,
    and hand any other exception to the hook that was there before. Called again once the
    process group exists: torch.distributed's own hook (which prefixes `[rankN]:`) writes what
    the hook it wraps prints into a buffer that it prints afterwards, and a hook that ends the
    process inside it would be silent; so ours goes outside it (once per hook it wraps)."""
    wrapped = sys.excepthook
    if getattr(wrapped, "ends_refusals", False):
        return

    def hook(kind: type[BaseException], error: BaseException, traceback) -> None:
        if isinstance(error, Refusal):
            end_with_refusal(error)
        wrapped(kind, error, traceback)

    hook.ends_refusals = True  # type: ignore[attr-defined]
    sys.excepthook = hook
