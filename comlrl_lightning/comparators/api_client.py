"""HTTP client of the comparator API (docs/preference.md §6, docs/decisions.md, decision 8): requests, retries,
back-off, concurrency.

:class:`APIComparatorClient` posts the bodies of :mod:`comlrl_lightning.comparators.api_formats` and parses
the answers with it. Unlike upstream, requests are retried (timeouts, connection errors, 429 honouring
``Retry-After``, 5xx, malformed JSON, too few completions) with bounded exponential back-off and jitter,
requests run concurrently up to ``max_concurrency``, the completion count is checked, and an unknown
format is an error rather than a silent fallback to ``generic`` (docs/decisions.md, decision 1).

The API key is looked up when a request is built, never stored (unless given literally), and never
written to logs, exception messages, ``repr`` or pickles. Response bodies quoted in errors are cleaned of the key
and of every other secret of the settings (secret header values, URL query values, extra-body strings), in any
letter case and URL-encoded or base64 forms; httpx's own request log lines lose their URL query values. A URL
with credentials (``https://user:password@host``) is refused: httpx would send them as Basic auth, and they would
travel wherever the URL is printed; send a key through ``key``/``key_env`` or a header instead.

A component: standard library, ``httpx`` and the wire formats only (no Lightning, no torch), so that the
code environment's expert client can use it too.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from comlrl_lightning.comparators.api_formats import (
    CompletionRequest,
    CompletionSchemaError,
    chunk_sizes,
    default_key_env,
    extract_completions,
    normalize_api_format,
    request_body,
    request_headers,
)
from comlrl_lightning.comparators.api_transport import (
    APIComparatorError,
    Retry,
    Secret,
    endpoint_of,
    post_json,
    redact_text,
    register_secrets,
    request_secrets,
    run_all,
    status_text,
)

if TYPE_CHECKING:
    from typing_extensions import Self

logger = logging.getLogger(__name__)

__all__ = ["APIComparatorClient", "APIComparatorError"]

_MAX_RETRIES_LIMIT = 20


class APIComparatorClient:
    """Client for the comparator endpoint. Options carry the spec's names without ``comparator_api_``.

    Args:
        url: endpoint (``http``/``https``) that receives every POST; no ``user:password@`` credentials.
        format: ``generic``, ``openai``, ``anthropic`` or ``openai_responses`` (or an alias, docs/preference.md §2.5).
        model: ``model`` field of each request (generic: sent only when truthy).
        timeout: seconds per HTTP request, in total (connect, send, headers and body together: a server
            that drips bytes is cut at this deadline), and per single read or write.
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
        max_response_mb: largest response body, both as received and once decompressed; a larger one
            fails the request at once (the body is streamed and decoding stops at the cap).
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
        max_response_mb: float = 32.0,
    ) -> None:
        if not url or not str(url).strip():
            raise ValueError(
                "comparator_api_url is required when comparator_policy='api'; got an empty value."
            )
        url = str(url).strip()
        if urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"comparator_api_url must be an http(s) URL; got {endpoint_of(url)!r}.")
        try:
            _ = urlsplit(url).port  # parses the port
        except ValueError:  # its message quotes the text after ':' (a password with a '/', say): not shown
            raise ValueError(
                "comparator_api_url is not a valid http(s) URL: the part between '//' and the next '/' must be "
                "host or host:port (no credentials). Put a key in comparator_api_key_env instead."
            ) from None
        if "@" in urlsplit(url).netloc:
            raise ValueError(
                f"comparator_api_url must not carry credentials ('user:password@' before the host; got "
                f"{endpoint_of(url)!r} with them): they would be sent as Basic auth and printed wherever the URL is. "
                "Put the key in the environment variable named by comparator_api_key_env (or comparator_api_key), "
                "or send it in comparator_api_headers."
            )
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
        if not (
            isinstance(max_response_mb, (int, float))
            and not isinstance(max_response_mb, bool)
            and math.isfinite(max_response_mb)
            and max_response_mb > 0
        ):
            raise ValueError(
                f"comparator_api_max_response_mb must be a positive finite number of MiB; got {max_response_mb!r}."
            )
        self.max_response_mb = float(max_response_mb)
        self._key = Secret(key) if key else None
        self._key_dropped = False
        # what an echoing server or a log line could print: scrubbed from error excerpts and httpx's log
        register_secrets(key, *request_secrets(url, self.headers, self.extra_body))
        self._endpoint = endpoint_of(url)
        self._lock = threading.Lock()
        self._http: httpx.Client | None = None
        self._rng = random.Random()

    @classmethod
    def from_config(cls, cfg: Any, **overrides: Any) -> APIComparatorClient:
        """Build from any object with the spec's ``comparator_api_*`` attributes (missing ones: defaults).

        Our additions are read as ``comparator_api_max_retries``, ``comparator_api_backoff_base_s``,
        ``comparator_api_backoff_max_s``, ``comparator_api_max_concurrency`` and
        ``comparator_api_max_response_mb`` when the object has them.
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
            "max_response_mb": 32.0,
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
        results = run_all(self._fetch, [(request, size) for _, request, size in plan], self.max_concurrency)
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
        register_secrets(*request_secrets(self.url, self.headers, self.extra_body))

    # ------------------------------------------------------------------ chunks and the key

    def _chunk_sizes(self, num_candidates: int) -> list[int]:
        return chunk_sizes(self.format, num_candidates, self.max_n_per_request, self.url, self.model)

    def _key_env_name(self) -> str | None:
        return self.key_env or default_key_env(self.format)

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
                raise Retry(
                    f"returned {len(texts)} completion(s) where {need} were requested", status, excerpt
                )
            except APIComparatorError as error:
                error.attempts = attempt
                raise
            except Retry as retry:
                if attempt > self.max_retries:
                    raise self._final_error(retry, attempt, wanted, len(collected)) from None
                delay = self._delay(attempt, retry.wait_s)
                logger.warning(
                    "Comparator API request to %s %s (%s); retry %d/%d in %.2f s.",
                    self._endpoint,
                    retry.reason,
                    status_text(retry.status),
                    attempt,
                    self.max_retries,
                    delay,
                )
                if stop is not None:
                    stop.wait(delay)
                else:
                    time.sleep(delay)

    def _attempt(self, request: CompletionRequest, n: int) -> tuple[list[str], int, str]:
        """One HTTP round trip: the parsed completions, the status and a redacted body excerpt, or ``Retry``."""
        key = self._current_key()
        register_secrets(key)  # a key read from the environment: known to the log filter from now on
        headers = request_headers(self.format, self.headers, key, self.key_header, self.key_prefix)
        body = request_body(self.format, request, n, self.model, self.extra_body)
        content = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
        payload, status, excerpt = post_json(
            self._client(), self.url, content, headers, endpoint=self._endpoint,
            redact=lambda text: self._redact(text, key),
            total_timeout_s=self.timeout,
            max_body_bytes=int(self.max_response_mb * 2**20),
        )
        return self._extract(payload, status, excerpt), status, excerpt

    def _extract(self, payload: Any, status: int | None = None, excerpt: str = "") -> list[str]:
        try:
            return extract_completions(self.format, payload, self.response_field)
        except CompletionSchemaError as exc:
            raise APIComparatorError(
                f"Comparator API response from {self._endpoint} ({self.format} format) is malformed: {exc}. "
                "Completions must be strings.",
                endpoint=self._endpoint,
                status=status,
                body_excerpt=excerpt,
                attempts=1,
            ) from None

    def _final_error(self, retry: Retry, attempts: int, wanted: int, got: int) -> APIComparatorError:
        message = (
            f"Comparator API request to {self._endpoint} {retry.reason} ({status_text(retry.status)}); "
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
                # No idle connections: each request opens its own, so that the total deadline knows
                # (and can shut down) its socket from the first byte on.
                self._http = httpx.Client(
                    timeout=httpx.Timeout(self.timeout),
                    limits=httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=0),
                )
            return self._http

    def _redact(self, text: str, key: str | None) -> str:
        """``text`` without the key or any secret of the settings, in any case or encoding, nor URL query values."""
        literal = self._key.get() if self._key is not None else None
        return redact_text(text, {key, literal, *request_secrets(self.url, self.headers, self.extra_body)})
