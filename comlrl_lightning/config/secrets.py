"""Keeping API keys out of everything a run writes: the one redaction path (docs/preference.md §6).

:func:`redact_secrets` is used for module hyper-parameters (``hparams.yaml``, every checkpoint), config
reprs and ``to_dict``, the W&B run config, the CLI's saved ``config.yaml`` and ``--print_config``. It finds
secrets by option name, under the trainer options (``comparator_api_*``) and the API client's arguments
(``key``, ``headers``, ``url``, ``extra_body``):

* the key (``comparator_api_key``, ``api_key``, ``key``) becomes None;
* every header value becomes "***" except the known-safe headers of :data:`SAFE_HEADERS`;
* every URL query value and a password in the URL become "***";
* every string of the extra body becomes "***" except under the known-safe fields of :data:`SAFE_BODY_FIELDS`
  (numbers, booleans and nulls are kept).

Environment-variable names (``comparator_api_key_env``) are kept: the key itself is read at request time.

Free text (error messages, the command line W&B records) cannot be cleaned by option name: :func:`secret_values`
collects the values the rules above hide, and :func:`scrub` / :func:`redact_text` remove them from any text, in
any letter case and in URL-encoded and base64 forms. The CLI collects them from its arguments and config files
before parsing (:func:`secrets_in_argv`), so jsonargparse's parse and value errors print no key, and it hands W&B a
command line without them (:func:`redact_argv`).
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator
from typing import Any

from comlrl_lightning.comparators.api_transport import (
    REDACTED,
    SAFE_BODY_FIELDS,
    SAFE_HEADERS,
    redact_text,
    redact_url,
    scrub,
    url_secrets,
)

__all__ = ["REDACTED", "SAFE_BODY_FIELDS", "SAFE_HEADERS", "argv_without", "redact_argv", "redact_body",
           "redact_headers", "redact_secrets", "redact_text", "redact_url", "scrub", "secret_values", "secrets_in_argv"]

SECRET_HEADER_WORDS = ("auth", "key", "token", "secret", "cookie")
_KEY_NAMES = ("comparator_api_key", "api_key", "key")
_HEADER_NAMES = ("comparator_api_headers", "headers")
_URL_NAMES = ("comparator_api_url", "url", "base_url")
_BODY_NAMES = ("comparator_api_extra_body", "extra_body")


def redact_headers(headers: Any) -> dict:
    """A copy of ``headers`` whose values are "***" unless the header is one of :data:`SAFE_HEADERS`."""
    return {h: (v if str(h).strip().lower() in SAFE_HEADERS else REDACTED) for h, v in dict(headers).items()}


def redact_body(body: Any, field: str | None = None) -> Any:
    """A copy of an extra request body: strings become "***" unless under a :data:`SAFE_BODY_FIELDS` field."""
    if isinstance(body, dict) or (hasattr(body, "items") and not isinstance(body, str)):
        return {k: redact_body(v, str(k)) for k, v in dict(body).items()}
    if isinstance(body, (list, tuple)):
        return [redact_body(v, field) for v in body]
    if isinstance(body, str):
        return body if field in SAFE_BODY_FIELDS else REDACTED
    return body


def _redact_value(name: str, value: Any) -> tuple[bool, Any]:
    """(True, redacted) when option ``name`` holds a secret, else (False, value)."""
    if not value:
        return False, value
    if name in _KEY_NAMES and isinstance(value, str):
        return True, None
    if name in _HEADER_NAMES and hasattr(value, "items"):
        return True, redact_headers(value)
    if name in _URL_NAMES and isinstance(value, str):
        return True, redact_url(value)
    if name in _BODY_NAMES and not isinstance(value, (str, bytes)):
        return True, redact_body(value)
    if name in _BODY_NAMES or name in _HEADER_NAMES:
        return True, REDACTED
    return False, value


def redact_secrets(value: Any) -> Any:
    """A copy of ``value`` (config dataclass, dict, list, jsonargparse namespace) without secrets.

    Nested containers are walked; see the module docstring for what counts as a secret.
    """
    mapping = isinstance(value, dict) or (
        hasattr(value, "keys") and hasattr(value, "__setitem__") and not hasattr(value, "__dataclass_fields__"))
    if mapping:
        out = value.clone() if hasattr(value, "clone") else copy.copy(value)
        for k in list(value.keys()):
            v = value[k]
            name = str(k).rsplit(".", 1)[-1]
            secret, red = _redact_value(name, v)
            out[k] = red if secret else redact_secrets(v)
        return out
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(redact_secrets(v) for v in value)
    if hasattr(value, "__dataclass_fields__"):
        out = copy.copy(value)
        for name in value.__dataclass_fields__:
            if not hasattr(out, name):
                continue
            secret, red = _redact_value(name, getattr(out, name))
            if secret:
                object.__setattr__(out, name, red)
        return out
    return value


def secret_values(value: Any) -> set[str]:
    """The strings :func:`redact_secrets` would hide in ``value`` (same walk, same rules): literal keys,
    header values but the safe ones, URL passwords and query values, extra-body strings but the safe fields."""
    found: set[str] = set()

    def strings(v: Any, field: str | None = None, safe: frozenset = frozenset()) -> None:
        if isinstance(v, str):
            if field not in safe and v:
                found.add(v)
        elif isinstance(v, dict) or (hasattr(v, "items") and not isinstance(v, str)):
            for k, item in dict(v.items()).items():
                strings(item, str(k) if safe is SAFE_BODY_FIELDS else str(k).strip().lower(), safe)
        elif isinstance(v, (list, tuple)):
            for item in v:
                strings(item, field, safe)

    def walk(v: Any, depth: int = 0) -> None:
        if depth > 64:
            return
        if hasattr(v, "__dataclass_fields__"):
            items = [(n, getattr(v, n)) for n in v.__dataclass_fields__ if hasattr(v, n)]
        elif isinstance(v, dict) or (hasattr(v, "keys") and hasattr(v, "__getitem__") and not isinstance(v, str)):
            items = [(str(k), v[k]) for k in list(v.keys())]
        elif isinstance(v, (list, tuple)):
            items = [("", item) for item in v]
        else:
            return
        for k, item in items:
            name = k.rsplit(".", 1)[-1]
            if not item:
                continue
            if name in _KEY_NAMES and isinstance(item, str):
                found.add(item)
            elif name in _URL_NAMES and isinstance(item, str):
                found.update(url_secrets(item))
            elif name in _HEADER_NAMES:
                strings(item, None, SAFE_HEADERS if hasattr(item, "items") else frozenset())
            elif name in _BODY_NAMES:
                strings(item, None, SAFE_BODY_FIELDS)
            else:
                walk(item, depth + 1)

    walk(value)
    return found


_SECRET_OPTIONS = frozenset((*_KEY_NAMES, *_HEADER_NAMES, *_URL_NAMES, *_BODY_NAMES))
_CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".jsonc")


def secrets_in_argv(args: list[str]) -> set[str]:
    """The secret values of a ``comlrl-lightning`` command line, before any parsing: the values of options named
    like a secret (``--model.init_args.args.init_args.comparator_api_key=...``, ``--...comparator_api_headers
    '{...}'``), and the secrets of every config it names (``--config run.yaml``) or gives inline (YAML/JSON)."""
    import os

    import yaml

    found: set[str] = set()

    def loaded(text: str) -> Any:
        try:
            if text.lower().endswith(_CONFIG_SUFFIXES) and os.path.isfile(text):
                with open(text, encoding="utf-8") as fh:
                    return yaml.safe_load(fh)
            if text.lstrip()[:1] in ("{", "[") or ":" in text and "\n" in text:
                return yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError):
            return None
        return None

    for i, arg in enumerate(args):
        option, eq, value = arg.partition("=")
        if not option.startswith("--"):
            value, option = arg, ""
        elif not eq:
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""
        name = option.rsplit(".", 1)[-1].lstrip("-")
        if name in _SECRET_OPTIONS and value:
            parsed = loaded(value) if name not in _KEY_NAMES + _URL_NAMES else None
            found |= secret_values({name: parsed if parsed is not None else value})
            if parsed is None and name in _HEADER_NAMES + _BODY_NAMES:
                found.add(value)  # a string jsonargparse will refuse: its error would print it
        elif value:
            parsed = loaded(value)
            if parsed is not None:
                found |= secret_values(parsed)
    return found


def redact_argv(args: list[str], secrets: set[str] | None = None) -> list[str]:
    """``args`` with every secret (``secrets``, else :func:`secrets_in_argv`) scrubbed from every argument."""
    secrets = secrets_in_argv(args) if secrets is None else secrets
    return [scrub(a, secrets) for a in args]


@contextlib.contextmanager
def argv_without(secrets: set[str]) -> Iterator[None]:
    """Inside the block, ``sys.argv`` holds no secret of ``secrets`` nor of :func:`secrets_in_argv` (W&B records
    ``sys.argv`` as the run's arguments when the run starts); the caller's ``sys.argv`` is restored after."""
    saved = list(sys.argv)
    sys.argv[1:] = redact_argv(sys.argv[1:], set(secrets) | secrets_in_argv(sys.argv[1:]))
    try:
        yield
    finally:
        sys.argv[:] = saved
