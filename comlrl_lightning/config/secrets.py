"""Keeping literal API keys and secret headers out of logs, reprs, checkpoints and saved CLI configs."""

from __future__ import annotations

import copy
from typing import Any

_SECRET_HEADER_WORDS = ("auth", "key", "token", "secret", "cookie")


def redact_headers(headers: Any) -> dict:
    """A copy of ``headers`` whose values become "***" when the name mentions auth/key/token/secret/cookie."""
    return {h: ("***" if any(w in str(h).lower() for w in _SECRET_HEADER_WORDS) else v)
            for h, v in dict(headers).items()}


def redact_secrets(value: Any) -> Any:
    """A copy of ``value`` (config object, dict, list, namespace) without literal API keys or secret headers.

    ``comparator_api_key`` becomes None and header values whose name mentions auth/key/token/secret/cookie
    become "***". Used for checkpoint hyperparameters and saved CLI configs.
    """
    mapping = isinstance(value, dict) or (
        hasattr(value, "keys") and hasattr(value, "__setitem__") and not hasattr(value, "__dataclass_fields__"))
    if mapping:
        out = value.clone() if hasattr(value, "clone") else copy.copy(value)
        for k in list(value.keys()):
            v = value[k]
            name = str(k).rsplit(".", 1)[-1]
            if name == "comparator_api_key" and v:
                out[k] = None
            elif name == "comparator_api_headers" and v:
                out[k] = redact_headers(v)
            else:
                out[k] = redact_secrets(v)
        return out
    if isinstance(value, (list, tuple)):
        return type(value)(redact_secrets(v) for v in value)
    if hasattr(value, "__dataclass_fields__"):
        out = copy.copy(value)
        if getattr(out, "comparator_api_key", None):
            out.comparator_api_key = None
        if getattr(out, "comparator_api_headers", None):
            out.comparator_api_headers = redact_headers(out.comparator_api_headers)
        return out
    return value
