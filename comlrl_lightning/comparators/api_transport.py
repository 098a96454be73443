"""HTTP transport of the comparator API client: one POST and its verdict, concurrency, errors, secrets.

:func:`post_json` sorts one round trip into a parsed JSON answer, a :class:`Retry` (timeouts, the total
deadline, connection errors, 429 with its ``Retry-After``, 408, 5xx, a non-JSON body) or an
:class:`APIComparatorError` (any other failure, a body over the size cap included). :func:`run_all` runs
the requests of one call on a bounded thread pool. What to send and how often to retry is
:class:`~comlrl_lightning.comparators.api_client.APIComparatorClient`'s business.
Standard library and ``httpx`` only.

Bounds on what a server can make us spend: every attempt has a *total* deadline (a timer shuts the
connection's socket down when it passes, so a server that drips bytes, even in the headers, is cut
there; per-read timeouts alone never fire on a drip), and the body is streamed and inflated here with
a cap on both the bytes received and the bytes after ``Content-Encoding`` (gzip, deflate) is undone,
so a compression bomb stops at the cap instead of filling memory.
"""

from __future__ import annotations

import email.utils
import json
import socket
import threading
import time
import zlib
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


class _Deadline:
    """Shuts down the sockets of one request when its total deadline passes (httpx has no total timeout).

    The sockets are learnt from httpcore's ``trace`` extension as connections open (the client keeps no
    idle connections, so every request opens its own) and from the response's network stream.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.fired = False
        self._sockets: list[Any] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def trace(self, name: str, info: Mapping[str, Any]) -> None:
        if name in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            self.watch(info.get("return_value"))

    def watch(self, stream: Any) -> None:
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            fired = self.fired
        if fired:
            _shutdown(sock)

    def check(self) -> None:
        if self.fired or time.monotonic() > self.deadline:
            self.fired = True
            raise Retry(f"exceeded the total deadline of {self.seconds:g} s")

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shutdown(sock)

    def cancel(self) -> None:
        self._timer.cancel()


def _shutdown(sock: Any) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _BoundedDecoder:
    """Undo ``Content-Encoding`` chunk by chunk without ever producing more than ``limit`` bytes."""

    def __init__(self, encoding: str, limit: int) -> None:
        self.limit, self.size = limit, 0
        codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
        codings = [c for c in codings if c != "identity"]
        if len(codings) > 1 or (codings and codings[0] not in ("gzip", "x-gzip", "deflate")):
            raise ValueError(f"unsupported Content-Encoding {encoding!r} (supported: gzip, deflate, identity)")
        self.coding = codings[0] if codings else None
        if self.coding in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(zlib.MAX_WBITS | 16)
        elif self.coding == "deflate":
            self._z, self._first = None, True  # zlib-wrapped or raw: decided by the first bytes
        self.parts: list[bytes] = []

    def feed(self, data: bytes) -> bool:
        """Add raw bytes; False once the decoded body passed the limit (decoding stops there)."""
        if self.coding is None:
            return self._add(data)
        if self.coding == "deflate" and self._z is None:
            raw = len(data) >= 2 and (data[0] & 0x0F) == 8 and ((data[0] << 8) | data[1]) % 31 == 0
            self._z = zlib.decompressobj(zlib.MAX_WBITS if raw else -zlib.MAX_WBITS)
        while data:
            room = self.limit - self.size + 1
            out = self._z.decompress(data, room)
            if not self._add(out):
                return False
            data = self._z.unconsumed_tail
            if not out and not data:
                break
        return True

    def _add(self, out: bytes) -> bool:
        self.size += len(out)
        if self.size > self.limit:
            return False
        self.parts.append(out)
        return True

    def body(self) -> bytes:
        return b"".join(self.parts)


def post_json(
    http: httpx.Client,
    url: str,
    content: bytes,
    headers: Mapping[str, str],
    *,
    endpoint: str,
    redact: Callable[[str], str],
    total_timeout_s: float = 120.0,
    max_body_bytes: int = 32 << 20,
) -> tuple[Any, int, str]:
    """One POST of ``content``: the parsed JSON answer, the status and a redacted body excerpt.

    The whole attempt (connect, send, headers, body) must end within ``total_timeout_s``; the body may
    not exceed ``max_body_bytes``, neither as received nor once decompressed. Raises :class:`Retry` for
    what another attempt may fix and :class:`APIComparatorError` otherwise; every text that leaves goes
    through ``redact`` first (it removes the key).
    """
    guard = _Deadline(total_timeout_s)
    try:
        headers = {**headers, "Accept-Encoding": "gzip, deflate"}
        with http.stream("POST", url, content=content, headers=headers, extensions={"trace": guard.trace}) as response:
            guard.watch(response.extensions.get("network_stream"))
            guard.check()
            status = response.status_code
            raw = _read_body(response, guard, max_body_bytes, endpoint)
    except _RETRYABLE_TRANSPORT as exc:
        if guard.fired and not isinstance(exc, httpx.TimeoutException):
            raise Retry(f"exceeded the total deadline of {total_timeout_s:g} s") from None
        raise Retry(f"failed with {type(exc).__name__}: {redact(str(exc))}") from None
    except httpx.HTTPError as exc:
        if guard.fired:
            raise Retry(f"exceeded the total deadline of {total_timeout_s:g} s") from None
        raise APIComparatorError(
            f"Comparator API request to {endpoint} failed: {type(exc).__name__}: {redact(str(exc))}",
            endpoint=endpoint,
            attempts=1,
        ) from None
    finally:
        guard.cancel()
    text = raw.decode(response.encoding or "utf-8", errors="replace")
    excerpt = redact(text[: _EXCERPT_CHARS * 2])[:_EXCERPT_CHARS]
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
        payload = json.loads(raw)
    except ValueError:
        # Gateways under load sometimes answer 200 with a truncated or HTML body: retry it.
        raise Retry("returned a non-JSON body", status, excerpt) from None
    return payload, status, excerpt


def _read_body(response: httpx.Response, guard: _Deadline, limit: int, endpoint: str) -> bytes:
    """The decoded body, streamed under the deadline and the size cap."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(endpoint, f"announces {int(declared)} bytes", limit, response.status_code)
    try:
        decoder = _BoundedDecoder(response.headers.get("content-encoding", ""), limit)
    except ValueError as exc:
        raise APIComparatorError(
            f"Comparator API response from {endpoint}: {exc}", endpoint=endpoint,
            status=response.status_code, attempts=1,
        ) from None
    received = 0
    for chunk in response.iter_raw(1 << 16):
        guard.check()
        received += len(chunk)
        if received > limit:
            raise _too_large(endpoint, "sent more than that", limit, response.status_code)
        try:
            if not decoder.feed(chunk):
                raise _too_large(endpoint, "inflates past that once decompressed", limit, response.status_code)
        except zlib.error as exc:
            raise Retry(f"sent a corrupt compressed body ({exc})", response.status_code) from None
    guard.check()
    return decoder.body()


def _too_large(endpoint: str, what: str, limit: int, status: int) -> APIComparatorError:
    return APIComparatorError(
        f"Comparator API response from {endpoint} exceeds the size cap of {limit} bytes "
        f"(comparator_api_max_response_mb): the body {what}.",
        endpoint=endpoint,
        status=status,
        attempts=1,
    )


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
