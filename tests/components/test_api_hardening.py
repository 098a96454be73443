"""The comparator API client against hostile servers: drips, compression bombs, oversized and ill-typed
answers. Each server is a raw loopback socket scripted byte by byte (the fake LLM server of the other
tests is too well-behaved for this)."""

from __future__ import annotations

import json
import resource
import socket
import threading
import time
import zlib

import pytest

from comlrl_lightning.comparators.api import APIComparatorClient, APIComparatorError, CompletionRequest


class RawServer:
    """Accepts connections on 127.0.0.1 and answers each with `script(conn)` after reading the request."""

    def __init__(self, script):
        self.script = script
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/generic"

    def _serve(self):
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn):
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, body = data.split(b"\r\n\r\n", 1)
            length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length")), b"0"))
            while len(body) < length:
                body += conn.recv(65536)
            self.script(conn, self.stop)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stop.set()
        self.sock.close()


@pytest.fixture
def raw_server():
    servers = []

    def make(script):
        servers.append(RawServer(script))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def client(url, **options):
    options = {"timeout": 1.0, "max_retries": 0, "backoff_base_s": 0.01, "backoff_max_s": 0.05, **options}
    return APIComparatorClient(url=url, format="generic", **options)


def one_request(m=2):
    return [CompletionRequest(prompt="p", agent_index=0, item={}, num_candidates=m)]


def respond(body: bytes, headers: str = "Content-Type: application/json\r\n"):
    def script(conn, stop):
        conn.sendall(f"HTTP/1.1 200 OK\r\n{headers}Content-Length: {len(body)}\r\n\r\n".encode() + body)

    return script


def drip(prefix: bytes, every_s: float = 0.1):
    """Send `prefix` one byte at a time, then keep dripping spaces forever (until the test ends)."""

    def script(conn, stop):
        data = prefix
        while not stop.is_set():
            conn.sendall(data[:1] if data else b" ")
            data = data[1:]
            time.sleep(every_s)

    return script


@pytest.mark.parametrize(
    "prefix",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n{\"completions\": [", id="body"),
        pytest.param(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000, id="headers"),
    ],
)
def test_a_dripping_server_is_cut_at_the_total_deadline(raw_server, prefix):
    server = raw_server(drip(prefix))
    start = time.monotonic()
    with pytest.raises(APIComparatorError, match="total deadline of 1 s") as info:
        client(server.url, timeout=1.0).generate(one_request())
    elapsed = time.monotonic() - start
    assert elapsed < 2.5, elapsed  # each byte arrives well within the per-read timeout
    assert info.value.endpoint == server.url


def _gzip_bomb(inflated_mb: int) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    zeros = b"\0" * (1 << 20)
    return b"".join(z.compress(zeros) for _ in range(inflated_mb)) + z.flush()


def test_a_gzip_bomb_stops_at_the_size_cap(raw_server):
    bomb = _gzip_bomb(256)  # ~250 KB on the wire, 256 MB inflated
    assert len(bomb) < 1 << 20
    server = raw_server(respond(bomb, "Content-Type: application/json\r\nContent-Encoding: gzip\r\n"))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(APIComparatorError, match="size cap.*inflates") as info:
        client(server.url, max_response_mb=2).generate(one_request())
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 64, grown_mb
    assert info.value.endpoint == server.url


def test_gzip_within_the_cap_is_decoded(raw_server):
    body = zlib.compress(json.dumps({"completions": ["a", "b"]}).encode())
    server = raw_server(respond(body, "Content-Type: application/json\r\nContent-Encoding: deflate\r\n"))
    assert client(server.url).generate(one_request()) == [["a", "b"]]


def test_an_oversized_body_fails_at_once(raw_server):
    big = json.dumps({"completions": ["x" * (3 << 20), "y"]}).encode()
    server = raw_server(respond(big))
    with pytest.raises(APIComparatorError, match="size cap of 1048576 bytes"):
        client(server.url, max_response_mb=1, max_retries=3).generate(one_request())

    def no_length(conn, stop):  # no Content-Length: counted while streaming
        conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + big)

    server = raw_server(no_length)
    with pytest.raises(APIComparatorError, match="sent more than that"):
        client(server.url, max_response_mb=1).generate(one_request())


@pytest.mark.parametrize(
    "completions",
    [[1, 2], {"text": "a", "b": 2}, 42, [{"text": 5}, "ok"], [["a"], "b"]],
    ids=["numbers", "object", "number", "text-is-number", "nested-list"],
)
def test_completions_that_are_not_strings_are_an_error_naming_the_endpoint(raw_server, completions):
    server = raw_server(respond(json.dumps({"completions": completions}).encode()))
    with pytest.raises(APIComparatorError, match=r"127\.0\.0\.1:\d+/generic.*malformed.*not a") as info:
        client(server.url, max_retries=2).generate(one_request())
    assert info.value.attempts == 1  # a schema error is not retried


def test_openai_content_must_be_a_string(raw_server):
    body = {"choices": [{"message": {"content": 5}}, {"message": {"content": "fine"}}]}
    server = raw_server(respond(json.dumps(body).encode()))
    url = server.url.replace("/generic", "/v1/chat/completions")
    api = APIComparatorClient(url=url, format="openai", timeout=1.0, max_retries=0)
    with pytest.raises(APIComparatorError, match="message.content is a int"):
        api.generate(one_request())


def test_max_response_mb_is_validated():
    for bad in (0, -1, float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="comparator_api_max_response_mb"):
            APIComparatorClient(url="http://127.0.0.1:1/x", max_response_mb=bad)
