"""HTTP transport of the comparator API client: one POST and its verdict, concurrency, errors, secrets.

:func:`post_json` sorts one round trip into a parsed JSON answer, a :class:`Retry` (timeouts, connection
errors, 429 with its ``Retry-After``, 408, 5xx, a non-JSON body) or an :class:`APIComparatorError` (any
other failure). :func:`run_all` runs the requests of one call on a bounded thread pool. What to send and
how often to retry is :class:`~comlrl_lightning.comparators.api_client.APIComparatorClient`'s business.
Standard library and ``httpx`` only.
"""

from __future__ import annotations

import email.utils
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx

__all__ = ["APIComparatorError", "Retry", "Secret", "endpoint_of", "post_json", "run_all", "status_text"]

T = TypeVar("T")

_EXCERPT_CHARS = 500
# Transient transport failures worth another attempt; protocol/proxy/URL errors are not.
_RETRYABLE_TRANSPORT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


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


class Retry(Exception):
    """A retryable outcome of one attempt (never escapes the client)."""

    def __init__(
        self, reason: str, status: int | None = None, excerpt: str = "", wait_s: float | None = None
    ):
        super().__init__(reason)
        self.reason, self.status, self.excerpt, self.wait_s = reason, status, excerpt, wait_s


class Secret:
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


def post_json(
    http: httpx.Client,
    url: str,
    content: bytes,
    headers: Mapping[str, str],
    *,
    endpoint: str,
    redact: Callable[[str], str],
) -> tuple[Any, int, str]:
    """One POST of ``content``: the parsed JSON answer, the status and a redacted body excerpt.

    Raises :class:`Retry` for what another attempt may fix and :class:`APIComparatorError` otherwise;
    every text that leaves goes through ``redact`` first (it removes the key).
    """
    try:
        response = http.post(url, content=content, headers=headers)
    except _RETRYABLE_TRANSPORT as exc:
        raise Retry(f"failed with {type(exc).__name__}: {redact(str(exc))}") from None
    except httpx.HTTPError as exc:
        raise APIComparatorError(
            f"Comparator API request to {endpoint} failed: {type(exc).__name__}: {redact(str(exc))}",
            endpoint=endpoint,
            attempts=1,
        ) from None
    status = response.status_code
    excerpt = redact(response.text[: _EXCERPT_CHARS * 2])[:_EXCERPT_CHARS]
    if status == 429:
        raise Retry("was rate limited", status, excerpt, _retry_after_s(response))
    if status == 408 or status >= 500:
        raise Retry("failed with a server error", status, excerpt)
    if not 200 <= status < 300:
        hint = " (insufficient balance)" if status == 402 else ""
        raise APIComparatorError(
            f"Comparator API request to {endpoint} failed with HTTP {status}{hint}: {excerpt!r}",
            endpoint=endpoint,
            status=status,
            body_excerpt=excerpt,
            attempts=1,
        )
    try:
        payload = response.json()
    except ValueError:
        # Gateways under load sometimes answer 200 with a truncated or HTML body: retry it.
        raise Retry("returned a non-JSON body", status, excerpt) from None
    return payload, status, excerpt


def run_all(
    fetch: Callable[..., T], jobs: Sequence[tuple[Any, ...]], max_concurrency: int
) -> list[T]:
    """``fetch(*job)`` for every job, results in job order, on at most ``max_concurrency`` threads.

    With threads, ``fetch`` also gets a ``threading.Event`` as last argument: it is set on the first
    failure so that running jobs stop retrying; queued ones are cancelled and that failure is raised.
    """
    if len(jobs) <= 1 or max_concurrency == 1:
        return [fetch(*job) for job in jobs]
    stop = threading.Event()
    pool = ThreadPoolExecutor(max_workers=min(max_concurrency, len(jobs)))
    try:
        futures = [pool.submit(fetch, *job, stop) for job in jobs]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        errors = [f.exception() for f in futures if f in done and f.exception() is not None]
        if errors:
            stop.set()
            raise errors[0]
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def status_text(status: int | None) -> str:
    return f"HTTP {status}" if status is not None else "no response"


def endpoint_of(url: str) -> str:
    """The URL without credentials, query or fragment: safe to print."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


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
