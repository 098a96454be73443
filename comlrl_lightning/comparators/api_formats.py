"""Wire formats of the comparator API (docs/multiturn.md §6): request bodies, headers and response parsing.

* ``generic``: one request per task item, ``{"prompt", "agent_idx", "num_return_sequences", ...}``; the
  completions are read from the dotted ``response_field``.
* ``openai`` (Chat Completions): ``n`` completions per request, at most ``max_n_per_request``.
* ``anthropic`` (Messages) and ``openai_responses`` (Responses): one request per candidate.

Pure functions of a canonical format name (:func:`normalize_api_format`); no I/O. The HTTP side
(retries, concurrency, the key) is :mod:`comlrl_lightning.comparators.api_client`.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "API_FORMAT_ALIASES",
    "CompletionRequest",
    "chunk_sizes",
    "default_key_env",
    "extract_completions",
    "normalize_api_format",
    "request_body",
    "request_headers",
]

API_FORMAT_ALIASES: dict[str, str] = {
    "generic": "generic",
    "openai": "openai",
    "openai_chat": "openai",
    "chat": "openai",
    "anthropic": "anthropic",
    "anthropic_messages": "anthropic",
    "messages": "anthropic",
    "openai_responses": "openai_responses",
    "responses": "openai_responses",
    "codex": "openai_responses",
}
_ANTHROPIC_VERSION = "2023-06-01"
_ANTHROPIC_DEFAULT_KEY_ENV = "ANTHROPIC_API_KEY"
_GENERIC_FALLBACK_FIELDS = ("completions", "responses", "outputs", "choices")


def normalize_api_format(value: str | None) -> str:
    """Map a ``comparator_api_format`` value (any case, surrounding whitespace) to its canonical name.

    ``None`` means ``generic``. Unknown values raise ``ValueError`` (docs/decisions.md, decision 1: upstream silently
    used ``generic``, which hides typos).
    """
    if value is None:
        return "generic"
    key = str(value).strip().lower()
    if key not in API_FORMAT_ALIASES:
        allowed = ", ".join(API_FORMAT_ALIASES)
        raise ValueError(f"comparator_api_format must be one of: {allowed}; got {value!r}.")
    return API_FORMAT_ALIASES[key]


@dataclass(frozen=True)
class CompletionRequest:
    """What to generate for one (task item, agent) pair: ``num_candidates`` completions of ``prompt``."""

    prompt: str
    agent_index: int
    item: Mapping[str, Any] = field(default_factory=dict)
    num_candidates: int = 1
    max_new_tokens: int | None = 256
    temperature: float | None = 0.6
    top_p: float | None = 0.6
    top_k: int | None = 50


def default_key_env(fmt: str) -> str | None:
    """The environment variable holding the key when ``comparator_api_key_env`` is unset."""
    # anthropic and openai_responses read their vendor's usual variable, as CoMLRL does
    return {"anthropic": _ANTHROPIC_DEFAULT_KEY_ENV, "openai_responses": "OPENAI_API_KEY"}.get(fmt)


def chunk_sizes(
    fmt: str, num_candidates: int, max_n_per_request: int | None, url: str, model: str | None
) -> list[int]:
    """Candidates asked by each HTTP request for one task item, in order (they sum to ``num_candidates``).

    OpenAI chat batches ``n`` up to ``max_n_per_request`` (None: all at once, but 1 for DeepSeek, which
    ignores ``n``); generic asks for everything in one request; the other formats one per request.
    """
    if fmt == "generic":
        return [num_candidates]
    if fmt == "openai":
        if max_n_per_request is not None:
            n_max = max(1, min(max_n_per_request, num_candidates))
        else:
            deepseek = "api.deepseek.com" in url or str(model or "").startswith("deepseek-")
            n_max = 1 if deepseek else num_candidates
        full, rest = divmod(num_candidates, n_max)
        return [n_max] * full + ([rest] if rest else [])
    return [1] * num_candidates  # anthropic, openai_responses: one request per candidate


def request_body(
    fmt: str, request: CompletionRequest, n: int, model: str | None, extra_body: Mapping[str, Any]
) -> dict[str, Any]:
    """The JSON body asking for ``n`` completions of ``request``; ``extra_body`` is merged over it."""
    messages = [{"role": "user", "content": request.prompt}]
    if fmt == "generic":
        body: dict[str, Any] = {
            "prompt": request.prompt,
            "agent_idx": request.agent_index,
            "num_return_sequences": n,
            "max_new_tokens": request.max_new_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": request.top_k,
            "batch_item": _json_safe(request.item),
        }
        if model:
            body["model"] = model
        body.update(extra_body)
        return body  # generic keeps explicit nulls, as upstream does
    if fmt == "openai":
        body = {
            "model": model,
            "messages": messages,
            "n": n,
            "max_tokens": request.max_new_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
        }
    elif fmt == "anthropic":
        body = {
            "model": model,
            "max_tokens": request.max_new_tokens,
            "messages": messages,
            "temperature": request.temperature,
        }
    else:  # openai_responses: no sampling settings (docs/multiturn.md §6)
        body = {"model": model, "input": request.prompt, "max_output_tokens": request.max_new_tokens}
    body.update(extra_body)
    return {k: v for k, v in body.items() if v is not None}


def request_headers(
    fmt: str, headers: Mapping[str, str], key: str | None, key_header: str, key_prefix: str | None
) -> dict[str, str]:
    """``Content-Type`` JSON, the extra ``headers``, then ``{key_header}: {key_prefix} {key}`` when a key is set.

    Anthropic gets its ``anthropic-version`` header, and ``Authorization: Bearer`` becomes ``x-api-key``.
    """
    out = {"Content-Type": "application/json"}
    _merge_headers(out, headers)
    if fmt == "anthropic" and not _has_header(out, "anthropic-version"):
        out["anthropic-version"] = _ANTHROPIC_VERSION
    if key:
        name, prefix = key_header, (key_prefix or "").strip()
        if fmt == "anthropic":
            if name.strip().lower() == "authorization":
                name = "x-api-key"
            if prefix.lower() == "bearer":
                prefix = ""
        _merge_headers(out, {name: f"{prefix} {key}" if prefix else key})
    return out


class CompletionSchemaError(ValueError):
    """A response whose completions are not strings (numbers, objects, ...): never turned into text."""


def _text(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise CompletionSchemaError(f"{where} is a {type(value).__name__} ({_short_json(value)}), not a string")


def _short_json(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def extract_completions(fmt: str, payload: Any, response_field: str) -> list[str]:
    """The completion texts of one parsed JSON response (too few or too many are the caller's concern).

    Strict about types: a completion that is present but not a string raises
    :class:`CompletionSchemaError` (nulls are dropped, as the spec says).
    """
    if fmt == "generic":
        return generic_completions(payload, response_field)
    if not isinstance(payload, dict):
        return []
    if fmt == "openai":
        texts = []
        for choice in payload.get("choices") or []:
            if isinstance(choice, dict):
                message = choice.get("message")
                text = _text(message.get("content"), "choices[].message.content") if isinstance(message, dict) else None
                text = _text(choice.get("text"), "choices[].text") if text is None else text
                if text is not None:
                    texts.append(text)
        return texts
    if fmt == "anthropic":
        blocks = [b for b in payload.get("content") or [] if isinstance(b, dict) and b.get("type") == "text"]
    else:
        blocks = [
            b
            for out in payload.get("output") or []
            if isinstance(out, dict)
            for b in out.get("content") or []
            if isinstance(b, dict) and b.get("type") in ("output_text", "text")
        ]
    texts = [t for b in blocks if (t := _text(b.get("text"), "the text block's text")) is not None]
    return texts[:1]  # spec: only the first text block of each response is a completion


# ---------------------------------------------------------------------- helpers


def _has_header(headers: Mapping[str, str], name: str) -> bool:
    return any(k.lower() == name.lower() for k in headers)


def _merge_headers(headers: dict[str, str], extra: Mapping[str, str]) -> None:
    """Update ``headers`` in place; a name given again in any case replaces the old entry."""
    for name, value in extra.items():
        for existing in [k for k in headers if k.lower() == str(name).lower()]:
            del headers[existing]
        headers[str(name)] = str(value)


def _json_safe(value: Any) -> Any:
    """The task item as plain JSON: mappings and sequences recurse, tensor/array scalars via ``.item()``,
    arrays via ``.tolist()``, non-finite floats become null, anything else ``str()``."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_json_safe(v) for v in value]
    for convert in ("tolist", "item"):  # arrays and tensors; exotic objects fall through to str()
        method = getattr(value, convert, None)
        if callable(method):
            with contextlib.suppress(Exception):
                return _json_safe(method())
    return str(value)


def _follow_path(payload: Any, dotted: str) -> tuple[bool, Any]:
    node = payload
    for part in dotted.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def generic_completions(payload: Any, response_field: str) -> list[str]:
    """Completions of a generic response (docs/multiturn.md §6): the dotted field, else the first truthy fallback."""
    found, value = _follow_path(payload, response_field)
    if not found and isinstance(payload, Mapping):
        value = next((payload[k] for k in _GENERIC_FALLBACK_FIELDS if payload.get(k)), None)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise CompletionSchemaError(
            f"field {response_field!r} is a {type(value).__name__} ({_short_json(value)}), "
            "not a list of strings"
        )
    texts = []
    for i, entry in enumerate(value):
        if isinstance(entry, Mapping):
            text = next(
                (entry[k] for k in ("text", "content", "completion", "response") if entry.get(k)), None
            )
            if text is None and isinstance(entry.get("message"), Mapping):
                text = entry["message"].get("content")
            entry = text
        text = _text(entry, f"item {i} of field {response_field!r}")
        if text is not None:
            texts.append(text)
    return texts
