"""Secrets stay secret: which names and values are secrets, and how every record is redacted.

A key is a secret when one of its words (split at `.`, `_`, `-` and camelCase) is token, key,
secret, password, passwd, credential(s), auth or apikey: `WANDB_API_KEY`, `+api_token=...`,
`hf_token`, but not `tokenizer`, `tokens_per_sec` or `exclude_keys`. The `user:password@` of a
URL is redacted wherever it appears (a remote data source's path). A value is a secret when it
equals the value of a secret environment variable, or was given to a secret key in an override.
Values shorter than `MIN_SECRET_CHARS` are only redacted next to their key, so that a short value
("1", "true") is not blanked out of every log line.

Every writer of a record goes through here: the W&B config (`redact`), `.hydra/*.yaml` and the
program arguments W&B records (`lightning_dist.run.run_dir`), the log files (`SecretFilter`, set in
conf/train.yaml), summary.json and the one-line errors.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from typing import Any

REDACTED = "<redacted>"
MIN_SECRET_CHARS = 6
"""Shorter values are redacted next to a secret key only, never as free text."""

_SECRET_WORDS = {
    "token",
    "key",
    "secret",
    "password",
    "passwd",
    "credential",
    "credentials",
    "auth",
    "apikey",
}
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
# `name=value` in overrides, program arguments and log lines; the name may carry Hydra's +, ++, ~.
_ASSIGNMENT = re.compile(r"(?P<name>[~+]*[A-Za-z_][\w.\-/@]*)=(?P<value>[^\s,;'\"\]]+)")

# The `user:password@` of a URL (s3://KEY:SECRET@bucket/..., https://user:pass@host/...); a
# secret may hold "/", so everything up to the @ goes (a key with an @ in it loses its head).
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)[^@\s'\"]+@")

# `name: value` inside a YAML flow mapping of an override (`data.sources=[{key: ..., ...}]`).
_FLOW_ENTRY = re.compile(
    r"(?P<name>[A-Za-z_][\w\-]*):\s*(?P<q>['\"]?)(?P<value>[^\s{\[,;'\"\]}]+)(?P=q)"
)

_remembered: set[str] = set()


def is_secret_key(name: Any) -> bool:
    """Whether a config key, override name or environment variable names a secret."""
    return any(word.lower() in _SECRET_WORDS for word in _WORD_SPLIT.split(str(name)) if word)


def remember_secrets(values: Iterable[str]) -> None:
    """Treat these values as secrets from now on, in this process (e.g. from the overrides)."""
    _remembered.update(v for v in values if len(v) >= MIN_SECRET_CHARS)


def override_secrets(overrides: Iterable[str]) -> list[str]:
    """The values that overrides such as `+api_token=...` give to secret keys."""
    out = []
    for item in overrides:
        name, sep, value = str(item).partition("=")
        if sep and is_secret_key(name.lstrip("+~")):
            out.append(value.strip("'\""))
    return out


def secret_values() -> set[str]:
    """Values to redact wherever they appear: secret environment variables and remembered ones."""
    env = {v for k, v in os.environ.items() if is_secret_key(k) and len(v) >= MIN_SECRET_CHARS}
    return env | _remembered


def redact_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """`text` with `name=value` of secret names, and every secret value, replaced."""
    text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    text = _FLOW_ENTRY.sub(
        lambda m: f"{m['name']}: {REDACTED}" if is_secret_key(m["name"]) else m[0], text
    )
    text = _ASSIGNMENT.sub(
        lambda m: f"{m['name']}={REDACTED}" if is_secret_key(m["name"]) else m[0], text
    )
    # Longest first, so a secret that contains another is replaced whole.
    for value in sorted(secret_values() if secrets is None else secrets, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def redact(value: Any, secrets: Iterable[str] | None = None) -> Any:
    """A copy of nested dicts/lists with the values of secret keys, and secret values, replaced."""
    secrets = secret_values() if secrets is None else set(secrets)
    if isinstance(value, dict):
        return {
            k: (REDACTED if is_secret_key(k) and v is not None else redact(v, secrets))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v, secrets) for v in value]
    if isinstance(value, str):
        return redact_text(value, secrets)
    return value


class SecretFilter(logging.Filter):
    """A logging filter that redacts every record (conf/train.yaml puts it on Hydra's handlers,
    so the job log files and Hydra's own lines, such as a multirun's overrides, carry none)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True
