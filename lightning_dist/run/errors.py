"""Configuration errors of a run, reported as one line on every rank before training starts."""

from __future__ import annotations

import contextlib
import re
import sys

from lightning_dist.options.presets import presets_with_knob
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


_FOREIGN_KNOB = re.compile(r"Could not override 'strategy\.(\w+)'\. Key '\1' not in '(\w+)Schema'")


def foreign_knob_hint(text: str) -> str:
    """For Hydra's refusal of a strategy knob the chosen strategy does not take (`strategy=fsdp
    strategy.shard_optimizer=true`): which strategies take it, or '' for any other text."""
    match = _FOREIGN_KNOB.search(text)
    knob = match.group(1) if match else ""
    takers = presets_with_knob(knob) if knob else []
    if not takers:
        return ""
    return (
        f"; strategy.{knob} is a setting of {', '.join(takers)}: choose "
        f"{'that strategy' if len(takers) == 1 else 'one of those strategies'}, or drop the "
        "override"
    )


def report_config_error(error: BaseException | str) -> None:
    """Print `error: <one line>` on stderr, with secrets redacted, and exit with status 2."""
    from omegaconf.errors import OmegaConfBaseException

    text = str(error)
    cause = getattr(error, "__cause__", None)
    if isinstance(cause, OmegaConfBaseException) and str(cause) not in text:
        text += "\n" + str(cause)  # Hydra's compose errors keep the details in their cause
    line = one_line(text)
    print_line(f"error: {redact_text(line + foreign_knob_hint(line))}")
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
