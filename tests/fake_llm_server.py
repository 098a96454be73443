"""A loopback HTTP server that speaks the four comparator API formats, for tests.

Paths: ``/generic``, ``/v1/chat/completions`` (OpenAI chat), ``/v1/messages`` (Anthropic),
``/v1/responses`` (OpenAI Responses). Every request is recorded (path, lower-cased headers, JSON body,
arrival and finish times), and the number of requests in flight is tracked.

Faults are scripted with :meth:`FakeLLMServer.enqueue` (one fault per arriving request, in order) or
:meth:`FakeLLMServer.always` (every request once the queue is empty)::

    server.enqueue(slow(0.5), rate_limited(0.2), http_error(500))
    server.always(completions(1))  # too few completions, forever

Completion texts are ``"{prompt}|{i}"`` for the i-th completion of a response unless ``texts`` is set.
Usage: ``from fake_llm_server import fake_llm_server`` in a test module, then take ``fake_llm_server``
as a fixture argument. The server binds 127.0.0.1 on a free port only.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

PATHS = {
    "generic": "/generic",
    "openai": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "openai_responses": "/v1/responses",
}
_PROTOCOL_OF_PATH = {path: name for name, path in PATHS.items()}


@dataclass
class Fault:
    """How to answer one request. The defaults give a normal, well-formed answer."""

    delay_s: float = 0.0  # sleep before answering (longer than the client timeout = a timeout)
    status: int = 200  # non-200: answer this status with `body`
    body: str | None = None  # raw body instead of the protocol's JSON (e.g. malformed JSON)
    headers: dict[str, str] = field(default_factory=dict)
    count: int | None = None  # number of completions to return instead of the number asked for


def slow(seconds: float) -> Fault:
    return Fault(delay_s=seconds)


def rate_limited(retry_after: float | str) -> Fault:
    return Fault(status=429, body='{"error": "rate limited"}', headers={"Retry-After": str(retry_after)})


def http_error(status: int, body: str = '{"error": "scripted failure"}') -> Fault:
    return Fault(status=status, body=body)


def malformed_json() -> Fault:
    return Fault(body='{"completions": ["unterminated')


def completions(count: int) -> Fault:
    return Fault(count=count)


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # parsed JSON, or the raw text when it was not JSON
    started: float  # time.monotonic() at arrival
    finished: float = 0.0


class FakeLLMServer:
    """Threaded loopback server; see the module docstring."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.max_in_flight = 0
        self.generic_response_field = "completions"  # dotted path the generic answer is nested under
        self.texts: Callable[[str, dict[str, Any], int], str] | None = None  # (protocol, body, i) -> text
        self._queue: deque[Fault] = deque()
        self._always: Fault | None = None
        self._in_flight = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True)

    # -- control
    def start(self) -> FakeLLMServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def url(self, protocol: str = "generic", query: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{PATHS[protocol]}" + (f"?{query}" if query else "")

    def enqueue(self, *faults: Fault) -> None:
        with self._lock:
            self._queue.extend(faults)

    def always(self, fault: Fault | None) -> None:
        with self._lock:
            self._always = fault

    # -- serving
    def _next_fault(self) -> Fault:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
            return self._always or Fault()

    def _text(self, protocol: str, body: dict[str, Any], i: int) -> str:
        if self.texts is not None:
            return self.texts(protocol, body, i)
        prompt = (
            body.get("prompt") or body.get("input") or (body.get("messages") or [{}])[0].get("content", "")
        )
        return f"{prompt}|{i}"

    def answer(self, protocol: str, body: dict[str, Any], count: int | None) -> dict[str, Any]:
        """The well-formed JSON answer of ``protocol`` to ``body``, with ``count`` completions if given."""
        if protocol == "generic":
            n = body.get("num_return_sequences", 1) if count is None else count
            node: Any = [self._text(protocol, body, i) for i in range(n)]
            for part in reversed(self.generic_response_field.split(".")):
                node = {part: node}
            return node
        if protocol == "openai":
            n = body.get("n", 1) if count is None else count
            return {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": self._text(protocol, body, i)},
                        "finish_reason": "stop",
                    }
                    for i in range(n)
                ],
            }
        n = 1 if count is None else count
        blocks = [{"type": "text", "text": self._text(protocol, body, i)} for i in range(n)]
        if protocol == "anthropic":
            return {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": body.get("model"),
                "content": blocks,
                "stop_reason": "end_turn",
            }
        for block in blocks:
            block["type"] = "output_text"
        return {
            "id": "resp_fake",
            "object": "response",
            "model": body.get("model"),
            "output": [
                {"type": "reasoning", "summary": []},
                {"type": "message", "role": "assistant", "content": blocks},
            ],
        }


def _make_handler(server: FakeLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode("utf-8", "replace")
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw
            record = RecordedRequest(
                path=self.path.split("?")[0],
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
                started=time.monotonic(),
            )
            with server._lock:
                server.requests.append(record)
                server._in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server._in_flight)
            try:
                status, headers, data = self._answer(server._next_fault(), record)
            finally:
                # Counted out before the reply is written: a client may send its next request as soon as
                # it has read this one, and that must not look like one request too many in flight.
                record.finished = time.monotonic()
                with server._lock:
                    server._in_flight -= 1
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout): expected for slow answers

        def _answer(self, fault: Fault, record: RecordedRequest) -> tuple[int, dict[str, str], bytes]:
            if fault.delay_s:
                time.sleep(fault.delay_s)
            protocol = _PROTOCOL_OF_PATH.get(record.path)
            status = fault.status
            if fault.body is not None:
                payload = fault.body
            elif protocol is None:
                status, payload = 404, json.dumps({"error": f"unknown path {record.path}"})
            elif not isinstance(record.body, dict):
                status, payload = 400, json.dumps({"error": "body is not a JSON object"})
            else:
                payload = json.dumps(server.answer(protocol, record.body, fault.count))
            return status, fault.headers, payload.encode("utf-8")

    return Handler


@pytest.fixture
def fake_llm_server():
    """A started :class:`FakeLLMServer` on 127.0.0.1, stopped after the test."""
    server = FakeLLMServer().start()
    try:
        yield server
    finally:
        server.stop()
