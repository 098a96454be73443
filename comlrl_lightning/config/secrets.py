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
"""

from __future__ import annotations

import copy
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "***"
_SECRET_HEADER_WORDS = ("auth", "key", "token", "secret", "cookie")
#: Header names whose values are never secret (compared lower-case).
SAFE_HEADERS = frozenset({"accept", "accept-encoding", "accept-language", "content-type", "user-agent",
                          "anthropic-version", "anthropic-beta", "openai-beta", "openai-organization",
                          "openai-project"})
#: Extra-body fields whose string values are never secret.
SAFE_BODY_FIELDS = frozenset({"model", "stop", "stop_sequences", "reasoning_effort", "effort", "response_format",
                              "type", "role", "tool_choice", "service_tier", "verbosity", "format", "summary"})
_KEY_NAMES = ("comparator_api_key", "api_key", "key")
_HEADER_NAMES = ("comparator_api_headers", "headers")
_URL_NAMES = ("comparator_api_url", "url", "base_url")
_BODY_NAMES = ("comparator_api_extra_body", "extra_body")


def redact_headers(headers: Any) -> dict:
    """A copy of ``headers`` whose values are "***" unless the header is one of :data:`SAFE_HEADERS`."""
    return {h: (v if str(h).strip().lower() in SAFE_HEADERS else REDACTED) for h, v in dict(headers).items()}


def redact_url(url: Any) -> Any:
    """``url`` with every query value and the password of ``user:password@`` replaced by "***"."""
    if not isinstance(url, str) or not url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        netloc = f"{REDACTED}@{host}" if ":" not in userinfo else f"{userinfo.split(':', 1)[0]}:{REDACTED}@{host}"
    query = parts.query
    if query:
        query = urlencode([(k, REDACTED) for k, _ in parse_qsl(query, keep_blank_values=True)], safe="*")
    fragment = REDACTED if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


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
