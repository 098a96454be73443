"""HTTP comparator: candidate completions from an external LLM endpoint (spec §6, decision 8).

Four wire formats are spoken:

* ``generic``: one request per task item, ``{"prompt", "agent_idx", "num_return_sequences", ...}``; the
  completions are read from the dotted ``response_field``.
* ``openai`` (Chat Completions): ``n`` completions per request, at most ``max_n_per_request``.
* ``anthropic`` (Messages) and ``openai_responses`` (Responses): one request per candidate.

Unlike upstream, requests are retried (timeouts, connection errors, 429 honouring ``Retry-After``, 5xx,
malformed JSON, too few completions) with bounded exponential back-off and jitter, requests run
concurrently up to ``max_concurrency``, the completion count is checked, and an unknown format is an
error rather than a silent fallback to ``generic`` (decision 1).

The API key is looked up when a request is built, never stored (unless given literally), and never
written to logs, exception messages, ``repr`` or pickles.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import math
import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import httpx

if TYPE_CHECKING:
    from typing_extensions import Self

logger = logging.getLogger(__name__)

__all__ = [
    "API_FORMAT_ALIASES",
    "APIComparatorClient",
    "APIComparatorError",
    "CompletionRequest",
    "normalize_api_format",
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
_EXCERPT_CHARS = 500
_MAX_RETRIES_LIMIT = 20
# Transient transport failures worth another attempt; protocol/proxy/URL errors are not.
_RETRYABLE_TRANSPORT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


def normalize_api_format(value: str | None) -> str:
    """Map a ``comparator_api_format`` value (any case, surrounding whitespace) to its canonical name.

    ``None`` means ``generic``. Unknown values raise ``ValueError`` (decision 1: upstream silently
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


class APIComparatorError(RuntimeError):
    """A comparator API request that failed for good (after any retries).

    ``endpoint`` is the URL without query string or credentials, ``status`` the last HTTP status (None
    when no response arrived), ``body_excerpt`` the start of the last response body with the key redacted.
    """

    def __init__(
        self,
        message: str,
        *,
        endpoint: str,
        status: int | None = None,
        body_excerpt: str = "",
        attempts: int = 0,
    ) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.status = status
        self.body_excerpt = body_excerpt
        self.attempts = attempts

    def __reduce__(self):  # keep the keyword-only attributes through pickling (e.g. worker processes)
        return (_rebuild_error, (self.args[0], self.endpoint, self.status, self.body_excerpt, self.attempts))


def _rebuild_error(message: str, endpoint: str, status: int | None, excerpt: str, attempts: int):
    return APIComparatorError(
        message, endpoint=endpoint, status=status, body_excerpt=excerpt, attempts=attempts
    )


class _Retry(Exception):
    """Internal: a retryable outcome of one attempt (never escapes the client)."""

    def __init__(
        self, reason: str, status: int | None = None, excerpt: str = "", wait_s: float | None = None
    ):
        super().__init__(reason)
        self.reason, self.status, self.excerpt, self.wait_s = reason, status, excerpt, wait_s


class _Secret:
    """Holds a literal key; prints as ``'***'`` and refuses to be pickled or copied."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "'***'"

    def __reduce__(self):
        raise TypeError("API keys are never pickled; use comparator_api_key_env.")


class APIComparatorClient:
    """Client for the comparator endpoint. Options carry the spec's names without ``comparator_api_``.

    Args:
        url: endpoint (``http``/``https``) that receives every POST.
        format: ``generic``, ``openai``, ``anthropic`` or ``openai_responses`` (or an alias, §2.5).
        model: ``model`` field of each request (generic: sent only when truthy).
        timeout: seconds per HTTP request (connect, read and write each).
        headers: extra headers, merged over ``Content-Type: application/json``.
        key: literal API key; wins over ``key_env``. Not pickled (use ``key_env`` for spawned workers).
        key_env: environment variable holding the key, read when each request is built. The
            ``anthropic`` format defaults to ``ANTHROPIC_API_KEY``.
        key_header, key_prefix: the key goes to ``{key_header}: {key_prefix} {key}`` (no prefix when
            it is blank). Anthropic remaps ``Authorization`` to ``x-api-key`` and drops ``Bearer``.
        response_field: dotted path of the completions in a generic response.
        extra_body: dict merged into every request body (it overrides).
        max_n_per_request: largest ``n`` of one OpenAI chat request (None: 1 for DeepSeek, else all).
        max_retries: extra attempts per HTTP request after the first (0–20).
        backoff_base_s, backoff_max_s: back-off before retry r is ``min(max, base * 2**r)`` times a
            jitter in [0.5, 1]; a ``Retry-After`` of a 429 replaces it. Every wait is capped at
            ``backoff_max_s`` so a run cannot stall on one endpoint.
        max_concurrency: most HTTP requests in flight at once.
    """

    def __init__(
        self,
        url: str,
        format: str | None = "generic",
        model: str | None = None,
        timeout: float = 120.0,
        headers: Mapping[str, str] | None = None,
        key: str | None = None,
        key_env: str | None = None,
        key_header: str = "Authorization",
        key_prefix: str | None = "Bearer",
        response_field: str = "completions",
        extra_body: Mapping[str, Any] | None = None,
        max_n_per_request: int | None = None,
        max_retries: int = 3,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        max_concurrency: int = 4,
    ) -> None:
        if not url or not str(url).strip():
            raise ValueError(
                "comparator_api_url is required when comparator_policy='api'; got an empty value."
            )
        url = str(url).strip()
        if urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"comparator_api_url must be an http(s) URL; got {_endpoint_of(url)!r}.")
        self.url = url
        self.format = normalize_api_format(format)
        self.model = model
        if not (isinstance(timeout, (int, float)) and timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"comparator_api_timeout must be a positive number of seconds; got {timeout!r}.")
        self.timeout = float(timeout)
        self.headers = dict(headers or {})
        self.key_env = key_env
        self.key_header = key_header or "Authorization"
        self.key_prefix = key_prefix
        self.response_field = response_field or "completions"
        if extra_body is not None and not isinstance(extra_body, Mapping):
            raise ValueError(f"comparator_api_extra_body must be a mapping; got {type(extra_body).__name__}.")
        self.extra_body = dict(extra_body or {})
        if max_n_per_request is not None and max_n_per_request < 1:
            raise ValueError(
                f"comparator_api_max_n_per_request must be >= 1 or null; got {max_n_per_request!r}."
            )
        self.max_n_per_request = max_n_per_request
        if not (isinstance(max_retries, int) and 0 <= max_retries <= _MAX_RETRIES_LIMIT):
            raise ValueError(
                f"max_retries must be an integer in [0, {_MAX_RETRIES_LIMIT}]; got {max_retries!r}."
            )
        self.max_retries = max_retries
        if backoff_base_s < 0 or backoff_max_s < 0:
            raise ValueError(
                f"backoff_base_s and backoff_max_s must be >= 0; got {backoff_base_s!r}, {backoff_max_s!r}."
            )
        self.backoff_base_s = float(backoff_base_s)
        self.backoff_max_s = float(backoff_max_s)
        if not (isinstance(max_concurrency, int) and max_concurrency >= 1):
            raise ValueError(f"max_concurrency must be an integer >= 1; got {max_concurrency!r}.")
        self.max_concurrency = max_concurrency
        self._key = _Secret(key) if key else None
        self._key_dropped = False
        self._endpoint = _endpoint_of(url)
        self._lock = threading.Lock()
        self._http: httpx.Client | None = None
        self._rng = random.Random()

    @classmethod
    def from_config(cls, cfg: Any, **overrides: Any) -> APIComparatorClient:
        """Build from any object with the spec's ``comparator_api_*`` attributes (missing ones: defaults).

        Our additions are read as ``comparator_api_max_retries``, ``comparator_api_backoff_base_s``,
        ``comparator_api_backoff_max_s`` and ``comparator_api_max_concurrency`` when the object has them.
        """
        defaults = {
            "url": None,
            "format": "generic",
            "model": None,
            "timeout": 120.0,
            "headers": None,
            "key": None,
            "key_env": None,
            "key_header": "Authorization",
            "key_prefix": "Bearer",
            "response_field": "completions",
            "extra_body": None,
            "max_n_per_request": None,
            "max_retries": 3,
            "backoff_base_s": 0.5,
            "backoff_max_s": 30.0,
            "max_concurrency": 4,
        }
        kwargs = {name: getattr(cfg, f"comparator_api_{name}", default) for name, default in defaults.items()}
        kwargs.update(overrides)
        return cls(**kwargs)

    # ------------------------------------------------------------------ public API

    def generate(self, requests: Sequence[CompletionRequest]) -> list[list[str]]:
        """Return ``num_candidates`` completions for each request, in request and candidate order.

        HTTP requests (one per item for generic, per ``n``-batch for OpenAI chat, per candidate for the
        single-completion formats) run on at most ``max_concurrency`` threads. The first request that
        fails for good cancels the others and raises ``APIComparatorError``.
        """
        plan: list[tuple[int, CompletionRequest, int]] = []  # (request index, request, candidates asked)
        for index, request in enumerate(requests):
            if request.num_candidates < 1:
                raise ValueError(f"num_candidates must be >= 1; got {request.num_candidates!r}.")
            plan.extend((index, request, size) for size in self._chunk_sizes(request.num_candidates))
        outputs: list[list[str]] = [[] for _ in requests]
        if not plan:
            return outputs
        if len(plan) == 1 or self.max_concurrency == 1:
            results = [self._fetch(request, size) for _, request, size in plan]
        else:
            stop = threading.Event()  # set on the first failure so running chunks stop retrying
            pool = ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(plan)))
            try:
                futures = [pool.submit(self._fetch, request, size, stop) for _, request, size in plan]
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                errors = [f.exception() for f in futures if f in done and f.exception() is not None]
                if errors:
                    stop.set()
                    raise errors[0]
                results = [f.result() for f in futures]
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
        for (index, _, _), texts in zip(plan, results, strict=True):
            outputs[index].extend(texts)
        return outputs

    def close(self) -> None:
        """Close pooled connections (a later ``generate`` opens new ones)."""
        with self._lock:
            http, self._http = self._http, None
        if http is not None:
            http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._key is not None:
            key_source = "literal"
        else:
            key_source = f"env:{self._key_env_name()}" if self._key_env_name() else "none"
        return (
            f"{type(self).__name__}(url={self._endpoint!r}, format={self.format!r}, model={self.model!r}, "
            f"key={key_source!r}, header_names={sorted(self.headers)!r}, max_retries={self.max_retries}, "
            f"max_concurrency={self.max_concurrency})"
        )

    def __getstate__(self) -> dict[str, Any]:
        # Connections, locks and the RNG are rebuilt; a literal key is never serialised.
        state = {k: v for k, v in self.__dict__.items() if k not in ("_http", "_lock", "_rng", "_key")}
        state["_key_dropped"] = self._key_dropped or self._key is not None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._key = None
        self._http = None
        self._lock = threading.Lock()
        self._rng = random.Random()

    # ------------------------------------------------------------------ requests and bodies

    def _chunk_sizes(self, num_candidates: int) -> list[int]:
        if self.format == "generic":
            return [num_candidates]
        if self.format == "openai":
            n_max = self._openai_n_max(num_candidates)
            full, rest = divmod(num_candidates, n_max)
            return [n_max] * full + ([rest] if rest else [])
        return [1] * num_candidates  # anthropic, openai_responses: one request per candidate

    def _openai_n_max(self, num_candidates: int) -> int:
        if self.max_n_per_request is not None:
            return max(1, min(self.max_n_per_request, num_candidates))
        deepseek = "api.deepseek.com" in self.url or str(self.model or "").startswith("deepseek-")
        return 1 if deepseek else num_candidates

    def _body(self, request: CompletionRequest, n: int) -> dict[str, Any]:
        messages = [{"role": "user", "content": request.prompt}]
        if self.format == "generic":
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
            if self.model:
                body["model"] = self.model
            body.update(self.extra_body)
            return body  # generic keeps explicit nulls, as upstream does
        if self.format == "openai":
            body = {
                "model": self.model,
                "messages": messages,
                "n": n,
                "max_tokens": request.max_new_tokens,
                "temperature": request.temperature,
                "top_p": request.top_p,
            }
        elif self.format == "anthropic":
            body = {
                "model": self.model,
                "max_tokens": request.max_new_tokens,
                "messages": messages,
                "temperature": request.temperature,
            }
        else:  # openai_responses: no sampling settings (spec §6)
            body = {"model": self.model, "input": request.prompt, "max_output_tokens": request.max_new_tokens}
        body.update(self.extra_body)
        return {k: v for k, v in body.items() if v is not None}

    def _key_env_name(self) -> str | None:
        if self.key_env:
            return self.key_env
        return _ANTHROPIC_DEFAULT_KEY_ENV if self.format == "anthropic" else None

    def _current_key(self) -> str | None:
        if self._key is not None:
            return self._key.get()
        env_name = self._key_env_name()
        key = os.environ.get(env_name) if env_name else None
        if not key and self._key_dropped:
            raise APIComparatorError(
                f"Comparator API client for {self._endpoint} was unpickled and a literal comparator_api_key "
                "is never pickled; set comparator_api_key_env to an environment variable holding the key.",
                endpoint=self._endpoint,
            )
        return key or None

    def _request_headers(self, key: str | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        _merge_headers(headers, self.headers)
        if self.format == "anthropic" and not _has_header(headers, "anthropic-version"):
            headers["anthropic-version"] = _ANTHROPIC_VERSION
        if key:
            name, prefix = self.key_header, (self.key_prefix or "").strip()
            if self.format == "anthropic":
                if name.strip().lower() == "authorization":
                    name = "x-api-key"
                if prefix.lower() == "bearer":
                    prefix = ""
            _merge_headers(headers, {name: f"{prefix} {key}" if prefix else key})
        return headers

    # ------------------------------------------------------------------ one chunk, with retries

    def _fetch(
        self, request: CompletionRequest, wanted: int, stop: threading.Event | None = None
    ) -> list[str]:
        """Exactly ``wanted`` completions for ``request``; retries, then ``APIComparatorError``."""
        collected: list[str] = []
        attempt = 0
        while True:
            attempt += 1
            need = wanted - len(collected)
            if stop is not None and stop.is_set():
                raise APIComparatorError(
                    f"Comparator API request to {self._endpoint} cancelled after another request failed.",
                    endpoint=self._endpoint,
                    attempts=attempt - 1,
                )
            try:
                texts, status, excerpt = self._attempt(request, need)
                if len(texts) > need:
                    logger.warning(
                        "Comparator API %s returned %d completions where %d were requested; keeping the "
                        "first %d.",
                        self._endpoint,
                        len(texts),
                        need,
                        need,
                    )
                    texts = texts[:need]
                collected.extend(texts)
                if len(collected) == wanted:
                    return collected
                raise _Retry(
                    f"returned {len(texts)} completion(s) where {need} were requested", status, excerpt
                )
            except APIComparatorError as error:
                error.attempts = attempt
                raise
            except _Retry as retry:
                if attempt > self.max_retries:
                    raise self._final_error(retry, attempt, wanted, len(collected)) from None
                delay = self._delay(attempt, retry.wait_s)
                logger.warning(
                    "Comparator API request to %s %s (%s); retry %d/%d in %.2f s.",
                    self._endpoint,
                    retry.reason,
                    _status_text(retry.status),
                    attempt,
                    self.max_retries,
                    delay,
                )
                if stop is not None:
                    stop.wait(delay)
                else:
                    time.sleep(delay)

    def _attempt(self, request: CompletionRequest, n: int) -> tuple[list[str], int, str]:
        """One HTTP round trip: the parsed completions, the status and a redacted body excerpt, or ``_Retry``."""
        key = self._current_key()
        headers = self._request_headers(key)
        content = json.dumps(self._body(request, n), ensure_ascii=False, allow_nan=False).encode("utf-8")
        try:
            response = self._client().post(self.url, content=content, headers=headers)
        except _RETRYABLE_TRANSPORT as exc:
            raise _Retry(f"failed with {type(exc).__name__}: {self._redact(str(exc), key)}") from None
        except httpx.HTTPError as exc:
            raise APIComparatorError(
                f"Comparator API request to {self._endpoint} failed: {type(exc).__name__}: "
                f"{self._redact(str(exc), key)}",
                endpoint=self._endpoint,
                attempts=1,
            ) from None
        status = response.status_code
        excerpt = self._redact(response.text[: _EXCERPT_CHARS * 2], key)[:_EXCERPT_CHARS]
        if status == 429:
            raise _Retry("was rate limited", status, excerpt, _retry_after_s(response))
        if status == 408 or status >= 500:
            raise _Retry("failed with a server error", status, excerpt)
        if not 200 <= status < 300:
            hint = " (insufficient balance)" if status == 402 else ""
            raise APIComparatorError(
                f"Comparator API request to {self._endpoint} failed with HTTP {status}{hint}: {excerpt!r}",
                endpoint=self._endpoint,
                status=status,
                body_excerpt=excerpt,
                attempts=1,
            )
        try:
            payload = response.json()
        except ValueError:
            # Gateways under load sometimes answer 200 with a truncated or HTML body: retry it.
            raise _Retry("returned a non-JSON body", status, excerpt) from None
        return self._extract(payload), status, excerpt

    def _extract(self, payload: Any) -> list[str]:
        if self.format == "generic":
            return _generic_completions(payload, self.response_field)
        if not isinstance(payload, dict):
            return []
        if self.format == "openai":
            texts = []
            for choice in payload.get("choices") or []:
                if isinstance(choice, dict):
                    message = choice.get("message")
                    text = message.get("content") if isinstance(message, dict) else None
                    text = choice.get("text") if text is None else text
                    if isinstance(text, str):
                        texts.append(text)
            return texts
        if self.format == "anthropic":
            blocks = [
                b for b in payload.get("content") or [] if isinstance(b, dict) and b.get("type") == "text"
            ]
        else:
            blocks = [
                b
                for out in payload.get("output") or []
                if isinstance(out, dict)
                for b in out.get("content") or []
                if isinstance(b, dict) and b.get("type") in ("output_text", "text")
            ]
        texts = [b["text"] for b in blocks if isinstance(b.get("text"), str)]
        return texts[:1]  # spec: only the first text block of each response is a completion

    def _final_error(self, retry: _Retry, attempts: int, wanted: int, got: int) -> APIComparatorError:
        message = (
            f"Comparator API request to {self._endpoint} {retry.reason} ({_status_text(retry.status)}); "
            f"giving up after "
            f"{attempts} attempt(s) with {got} of {wanted} completion(s)."
        )
        if (
            self.format == "openai"
            and retry.status is not None
            and retry.status < 300
            and got > 0
            and self.max_n_per_request != 1
        ):
            message += " If the endpoint ignores `n`, set comparator_api_max_n_per_request=1."
        if retry.excerpt:
            message += f" Response body: {retry.excerpt!r}"
        return APIComparatorError(
            message,
            endpoint=self._endpoint,
            status=retry.status,
            body_excerpt=retry.excerpt,
            attempts=attempts,
        )

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.backoff_max_s)
        backoff = min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1))
        with self._lock:
            jitter = self._rng.uniform(0.5, 1.0)
        return backoff * jitter

    def _client(self) -> httpx.Client:
        with self._lock:
            if self._http is None:
                self._http = httpx.Client(
                    timeout=httpx.Timeout(self.timeout),
                    limits=httpx.Limits(
                        max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency
                    ),
                )
            return self._http

    def _redact(self, text: str, key: str | None) -> str:
        for secret in {key, self._key.get() if self._key is not None else None}:
            if secret:
                text = text.replace(secret, "***")
        return text


# ---------------------------------------------------------------------- helpers (pure)


def _status_text(status: int | None) -> str:
    return f"HTTP {status}" if status is not None else "no response"


def _endpoint_of(url: str) -> str:
    """The URL without credentials, query or fragment: safe to print."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _has_header(headers: Mapping[str, str], name: str) -> bool:
    return any(k.lower() == name.lower() for k in headers)


def _merge_headers(headers: dict[str, str], extra: Mapping[str, str]) -> None:
    """Update ``headers`` in place; a name given again in any case replaces the old entry."""
    for name, value in extra.items():
        for existing in [k for k in headers if k.lower() == str(name).lower()]:
            del headers[existing]
        headers[str(name)] = str(value)


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - time.time())


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


def _generic_completions(payload: Any, response_field: str) -> list[str]:
    """Completions of a generic response (spec §6): the dotted field, else the first truthy fallback."""
    found, value = _follow_path(payload, response_field)
    if not found and isinstance(payload, Mapping):
        value = next((payload[k] for k in _GENERIC_FALLBACK_FIELDS if payload.get(k)), None)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        return [str(value)]
    texts = []
    for entry in value:
        if isinstance(entry, str):
            texts.append(entry)
        elif isinstance(entry, Mapping):
            text = next(
                (entry[k] for k in ("text", "content", "completion", "response") if entry.get(k)), None
            )
            if text is None and isinstance(entry.get("message"), Mapping):
                text = entry["message"].get("content")
            if text is not None:
                texts.append(text if isinstance(text, str) else str(text))
        elif entry is not None:
            texts.append(str(entry))
    return texts
