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

Secrets in text (docs/preference.md §6): :func:`scrub` removes known secret values from any text, in every
form a server or a library may echo them: any letter case, URL-encoded, and base64 (alone or inside a longer
base64 string such as HTTP Basic credentials). :func:`redact_text` also hides every URL's query values and
password. httpx's and httpcore's loggers pass their messages through both (:class:`CredentialLogFilter`,
installed on import), so a request line never prints ``?api_key=...``.
"""

from __future__ import annotations

import base64
import email.utils
import json
import logging
import math
import re
import socket
import sys
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, quote_plus, unquote, unquote_plus, urlencode, urlsplit, urlunsplit

import httpx

__all__ = ["APIComparatorError", "CredentialLogFilter", "Retry", "Secret", "endpoint_of", "post_json", "redact_text",
           "redact_url", "register_secrets", "request_secrets", "run_all", "scrub", "status_text"]

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
    except RecursionError:
        raise APIComparatorError(
            f"Comparator API response from {endpoint} nests JSON deeper than the parser allows "
            f"({sys.getrecursionlimit()} levels); no completion format needs that: {excerpt!r}",
            endpoint=endpoint, status=status, body_excerpt=excerpt, attempts=1,
        ) from None
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
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
    except ValueError:  # an invalid port: its text may be a password (``user:pass/word@host``)
        return f"{url.split(':', 1)[0]}://<invalid host>" if "://" in url else "<invalid URL>"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:  # "NaN" and "inf" parse as floats but are no delay: back off as without the header
        return seconds if math.isfinite(seconds) else None
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - time.time())


# ---------------------------------------------------------------------------------------------------------------
# Secrets in text

REDACTED = "***"
#: secrets shorter than this are not searched for in free text (they would match ordinary words)
MIN_SCRUB_CHARS = 6
_URL_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
#: Header names whose values are never secret (compared lower-case).
SAFE_HEADERS = frozenset({"accept", "accept-encoding", "accept-language", "content-type", "user-agent",
                          "anthropic-version", "anthropic-beta", "openai-beta", "openai-organization",
                          "openai-project"})
#: Extra-body fields whose string values are never secret.
SAFE_BODY_FIELDS = frozenset({"model", "stop", "stop_sequences", "reasoning_effort", "effort", "response_format",
                              "type", "role", "tool_choice", "service_tier", "verbosity", "format", "summary"})
_known_secrets: set[str] = set()
_known_lock = threading.Lock()


def redact_url(url: Any) -> Any:
    """``url`` with every query value, the fragment and the password of ``user:password@`` replaced by "***"."""
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


def url_secrets(url: Any) -> set[str]:
    """The values :func:`redact_url` hides: the password, the query values and the fragment."""
    if not isinstance(url, str) or not url:
        return set()
    try:
        parts = urlsplit(url)
    except ValueError:
        return {url}
    raw = [pair.partition("=")[2] for pair in parts.query.split("&")] + [parts.password or "", parts.fragment]
    return {form for v in raw if v for form in (v, unquote_plus(v), unquote(v))}  # as written and as decoded


def _base64_cores(secret: bytes) -> set[str]:
    """The characters of base64(x + secret + y) that depend on the secret alone, for each alignment of the
    secret in the encoded stream (so the key is found inside longer base64 text, e.g. ``user:key``)."""
    cores = set()
    for shift in range(3):
        text = base64.b64encode(b"\0" * shift + secret).decode().rstrip("=")
        start = (0, 2, 3)[shift]  # leading characters that mix in the bytes before the secret
        end = len(text) - (1 if (shift + len(secret)) % 3 else 0)  # the last one mixes in the bytes after
        core = text[start:end]
        if len(core) >= MIN_SCRUB_CHARS:
            cores |= {core, core.replace("+", "-").replace("/", "_")}
    return cores


def _forms(secret: str) -> tuple[set[str], set[str]]:
    """(forms matched in any letter case, base64 forms matched exactly) of ``secret``."""
    caseless = {secret, quote(secret, safe=""), quote_plus(secret), quote(secret, safe="/")}
    return caseless, _base64_cores(secret.encode("utf-8"))


def scrub(text: str, secrets: Any = ()) -> str:
    """``text`` with every secret of ``secrets`` (and of :func:`register_secrets`) replaced by "***", in any
    letter case, URL-encoded, or base64-encoded (alone or inside longer base64). Secrets shorter than
    :data:`MIN_SCRUB_CHARS` characters are left alone."""
    if not isinstance(text, str) or not text:
        return text
    with _known_lock:
        wanted = {s for s in (*secrets, *_known_secrets) if isinstance(s, str) and len(s) >= MIN_SCRUB_CHARS}
    if not wanted:
        return text
    caseless, exact = set(), set()
    for secret in wanted:
        a, b = _forms(secret)
        caseless |= a
        exact |= b
    for forms, flags in ((exact, 0), (caseless, re.IGNORECASE)):
        if forms:
            pattern = "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True))
            text = re.sub(pattern, REDACTED, text, flags=flags)
    return text


def redact_text(text: str, secrets: Any = ()) -> str:
    """:func:`scrub`, then every URL in ``text`` through :func:`redact_url`."""
    text = scrub(text, secrets)
    return _URL_PATTERN.sub(lambda m: redact_url(m.group()), text) if isinstance(text, str) and "://" in text else text


def request_secrets(url: Any = None, headers: Any = None, extra_body: Any = None) -> set[str]:
    """The secret values of one API client's settings: URL password and query values, every header value but those
    of :data:`SAFE_HEADERS`, every string of the extra body but under :data:`SAFE_BODY_FIELDS`."""
    found = url_secrets(url)
    for name, value in dict(headers or {}).items():
        if str(name).strip().lower() not in SAFE_HEADERS and isinstance(value, str) and value:
            found.add(value)

    def strings(v: Any, field: str | None) -> None:
        if isinstance(v, str):
            if v and field not in SAFE_BODY_FIELDS:
                found.add(v)
        elif isinstance(v, Mapping):
            for k, item in v.items():
                strings(item, str(k))
        elif isinstance(v, (list, tuple)):
            for item in v:
                strings(item, field)

    strings(extra_body if isinstance(extra_body, Mapping) else {}, None)
    return found


def register_secrets(*values: str | None) -> None:
    """Make ``values`` known to every later :func:`scrub` of this process (the log filter's included)."""
    with _known_lock:
        _known_secrets.update(v for v in values if isinstance(v, str) and len(v) >= MIN_SCRUB_CHARS)


class CredentialLogFilter(logging.Filter):
    """Rewrites a record's message through :func:`redact_text` (URL query values and passwords, known secrets)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is the logging module's business, not ours
            return True
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


#: the loggers of httpx and httpcore that print requests (a logger's filters see only its own records)
HTTP_LOGGERS = ("httpx", "httpcore", "httpcore.connection", "httpcore.connection_pool", "httpcore.http11",
                "httpcore.http2", "httpcore.proxy", "httpcore.socks")


def install_log_filter() -> None:
    """Put one :class:`CredentialLogFilter` on each of :data:`HTTP_LOGGERS` (idempotent)."""
    for name in HTTP_LOGGERS:
        target = logging.getLogger(name)
        if not any(isinstance(f, CredentialLogFilter) for f in target.filters):
            target.addFilter(CredentialLogFilter())


install_log_filter()
