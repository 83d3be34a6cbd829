"""Configuration errors of a run, reported as one line on every rank before training starts."""

from __future__ import annotations

import contextlib
import sys

from lightning_dist.runtime.console import print_line
from lightning_dist.runtime.redaction import redact_text
from lightning_dist.runtime.refusal import ConfigError, Refusal

__all__ = ["ConfigError", "Refusal", "config_errors", "report_config_error"]


@contextlib.contextmanager
def config_errors():
    """Turn the errors of building from config into `ConfigError`, unwrapping Hydra's wrapper."""
    from hydra.errors import InstantiationException

    try:
        yield
    except InstantiationException as e:
        cause = e.__cause__ or e
        raise ConfigError(str(cause).splitlines()[0]) from e
    except (ValueError, FileNotFoundError, ImportError) as e:
        raise ConfigError(str(e)) from e
    except Exception as e:  # Lightning's MisconfigurationException, e.g. from the Trainer
        if type(e).__name__ != "MisconfigurationException":
            raise
        raise ConfigError(str(e).splitlines()[0]) from e


_DETAIL_LINES = ("full_key:", "object_type=", "reference_type=", "To append to your config")


def one_line(text: str) -> str:
    """A multi-line message (Hydra's, with its option lists) as one line, without OmegaConf's
    `full_key:`/`object_type=` detail lines."""
    out = ""
    # Hydra's search path is noise here, and its "+key=value" hint is wrong for typed groups.
    for raw in str(text).split("\nConfig search path:")[0].splitlines():
        line = raw.strip()
        if not line or line.startswith(_DETAIL_LINES):
            continue
        if raw.startswith("\t") and out:  # an option of a list such as "Available options"
            out += (" " if out.endswith(":") else ", ") + line
        else:
            out += (" " if out.endswith((".", ":", ";")) else "; ") + line if out else line
    return out


def report_config_error(error: BaseException | str) -> None:
    """Print `error: <one line>` on stderr, with secrets redacted, and exit with status 2."""
    from omegaconf.errors import OmegaConfBaseException

    text = str(error)
    cause = getattr(error, "__cause__", None)
    if isinstance(cause, OmegaConfBaseException) and str(cause) not in text:
        text += "\n" + str(cause)  # Hydra's compose errors keep the details in their cause
    print_line(f"error: {redact_text(one_line(text))}")
    sys.exit(2)


def guard_command_line(args: list[str] | None = None) -> None:
    """For `train.py`, before Hydra starts: refuse overrides that have Hydra itself run code,
    check `run_name` (it names the run's folder), and report Hydra's configuration errors
    (unknown keys and config names) in one line."""
    from lightning_dist._compat import wrap_hydra_errors
    from lightning_dist.config.resolvers import run_name
    from lightning_dist.config.targets import check_hydra_overrides

    args = sys.argv[1:] if args is None else args
    try:
        check_hydra_overrides(args)
        for arg in args:  # the run's home is picked from it before any of our code runs
            key, _, value = arg.partition("=")
            if key.lstrip("+") == "run_name" and value not in ("", "null"):
                run_name(value, "", "", "")
    except ValueError as e:
        report_config_error(e)
    wrap_hydra_errors(report_config_error)
