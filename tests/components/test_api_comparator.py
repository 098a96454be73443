"""APIComparatorClient against the loopback fake server: wire formats, faults, concurrency, key hygiene."""

from __future__ import annotations

import copy
import logging
import pickle
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from comlrl_lightning.comparators.api import (
    APIComparatorClient,
    APIComparatorError,
    CompletionRequest,
    generic_completions,
    normalize_api_format,
)

try:  # tests/ is on sys.path when it has no __init__.py, the repo root otherwise
    from fake_llm_server import (
        completions,
        fake_llm_server,
        http_error,
        malformed_json,
        rate_limited,
        slow,
    )
except ImportError:  # pragma: no cover
    from tests.fake_llm_server import (
        completions,
        fake_llm_server,  # noqa: F401 - the pytest fixture
        http_error,
        malformed_json,
        rate_limited,
        slow,
    )

KEY = "sk-test-DUMMY-0123456789abcdef"


def make_client(server, fmt="generic", **options):
    options = {"timeout": 2.0, "max_retries": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.05, **options}
    return APIComparatorClient(url=server.url(normalize_api_format(fmt)), format=fmt, **options)


def req(prompt="p", m=3, agent=0, item=None, **sampling):
    return CompletionRequest(prompt=prompt, agent_index=agent, item=item or {}, num_candidates=m, **sampling)


# --------------------------------------------------------------------------- options


def test_client_is_a_component_without_torch_or_lightning():
    # the expert client of the code environment uses it: it must stay light (stdlib, httpx, the formats)
    code = ("import sys, comlrl_lightning.comparators.api_client; "
            "print(sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "generic"),
        ("generic", "generic"),
        (" OpenAI ", "openai"),
        ("openai_chat", "openai"),
        ("CHAT", "openai"),
        ("anthropic", "anthropic"),
        ("Anthropic_Messages", "anthropic"),
        ("messages\n", "anthropic"),
        ("openai_responses", "openai_responses"),
        ("Responses", "openai_responses"),
        (" codex", "openai_responses"),
    ],
)
def test_format_aliases_normalised(value, expected):
    assert normalize_api_format(value) == expected


@pytest.mark.parametrize("value", ["openai-chat", "gpt", "", "claude"])
def test_unknown_format_is_an_error_naming_option_value_and_allowed(value):
    with pytest.raises(ValueError) as info:
        APIComparatorClient(url="http://127.0.0.1:9/x", format=value)
    message = str(info.value)
    assert "comparator_api_format" in message and repr(value) in message
    assert "generic, openai, openai_chat, chat, anthropic" in message and "codex" in message


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"url": ""}, "comparator_api_url is required"),
        ({"url": "ftp://127.0.0.1/x"}, "comparator_api_url must be an http"),
        ({"timeout": 0}, "comparator_api_timeout"),
        ({"max_n_per_request": 0}, "comparator_api_max_n_per_request must be >= 1 or null"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": 1000}, "max_retries"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"backoff_base_s": -1.0}, "backoff_base_s"),
    ],
)
def test_option_validation(options, needle):
    with pytest.raises(ValueError, match=needle):
        APIComparatorClient(**{"url": "http://127.0.0.1:9/x", **options})


def test_from_config_reads_spec_option_names():
    cfg = SimpleNamespace(
        comparator_api_url="http://127.0.0.1:9/v1/messages",
        comparator_api_format=" Messages ",
        comparator_api_model="claude-test",
        comparator_api_timeout=5.0,
        comparator_api_headers={"X-Trace": "1"},
        comparator_api_key_env="MY_KEY",
        comparator_api_key_header="X-Key",
        comparator_api_key_prefix="Token",
        comparator_api_response_field="data.outs",
        comparator_api_extra_body={"top_k": 5},
        comparator_api_max_n_per_request=2,
        comparator_api_max_concurrency=7,
    )
    client = APIComparatorClient.from_config(cfg)
    assert (client.url, client.format, client.model, client.timeout) == (
        "http://127.0.0.1:9/v1/messages",
        "anthropic",
        "claude-test",
        5.0,
    )
    assert client.headers == {"X-Trace": "1"} and client.extra_body == {"top_k": 5}
    assert (client.key_env, client.key_header, client.key_prefix) == ("MY_KEY", "X-Key", "Token")
    assert client.response_field == "data.outs" and client.max_n_per_request == 2
    assert (
        client.max_concurrency == 7 and client.max_retries == 3
    )  # ours: from cfg when present, else default
    with pytest.raises(ValueError, match="comparator_api_format"):
        APIComparatorClient.from_config(
            SimpleNamespace(comparator_api_url="http://127.0.0.1:9", comparator_api_format="x")
        )


# --------------------------------------------------------------------------- generic


class _Scalar:  # a tensor-like scalar: JSON-safe through .item()
    def item(self):
        return 7


def test_generic_request_body_headers_and_parsing(fake_llm_server, monkeypatch):
    monkeypatch.setenv("CMP_KEY", KEY)
    client = make_client(
        fake_llm_server,
        model="m1",
        key_env="CMP_KEY",
        headers={"X-Trace": "abc", "authorization": "stale"},
        extra_body={"temperature": 0.0, "stop": ["\n"]},
    )
    item = {
        "id": 3,
        "pair": (1, 2),
        "nested": {"x": [1.5, None]},
        "scalar": _Scalar(),
        "obj": object,
        "bad": float("nan"),
    }
    out = client.generate([req("hello", m=3, agent=1, item=item, max_new_tokens=16, top_k=None)])
    assert out == [["hello|0", "hello|1", "hello|2"]]
    (record,) = fake_llm_server.requests
    assert record.path == "/generic"
    assert record.body == {
        "prompt": "hello",
        "agent_idx": 1,
        "num_return_sequences": 3,
        "max_new_tokens": 16,
        "temperature": 0.0,  # extra_body overrides
        "top_p": 0.6,
        "top_k": None,  # generic keeps nulls
        "batch_item": {
            "id": 3,
            "pair": [1, 2],
            "nested": {"x": [1.5, None]},
            "scalar": 7,
            "obj": str(object),
            "bad": None,
        },
        "model": "m1",
        "stop": ["\n"],
    }
    assert record.headers["content-type"] == "application/json"
    assert record.headers["x-trace"] == "abc"
    assert record.headers["authorization"] == f"Bearer {KEY}"  # the key header replaces the user's


def test_generic_without_model_or_key_sends_neither(fake_llm_server, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    make_client(fake_llm_server).generate([req(m=1)])
    (record,) = fake_llm_server.requests
    assert "model" not in record.body and "authorization" not in record.headers


def test_generic_dotted_response_field(fake_llm_server):
    fake_llm_server.generic_response_field = "data.outs"
    out = make_client(fake_llm_server, response_field="data.outs").generate([req("q", m=2)])
    assert out == [["q|0", "q|1"]]


def test_generic_response_normalisation_matches_spec_examples():
    payload = {"data": {"outs": [{"text": "a"}, {"message": {"content": "b"}}, "c"]}}
    assert generic_completions(payload, "data.outs") == ["a", "b", "c"]
    # Stricter than the spec's normalisation: numbers and objects are never turned into text.
    for bad in ([{"text": "a"}, 3], {"text": "a"}, 7, [["nested"]]):
        with pytest.raises(ValueError, match="not a"):
            generic_completions({"completions": bad}, "completions")
    assert generic_completions({"choices": [{"text": "x"}, {"text": "y"}]}, "completions") == ["x", "y"]
    assert generic_completions({"completions": "one"}, "completions") == ["one"]
    assert generic_completions({"completions": None}, "completions") == []
    assert generic_completions({"outputs": [{"completion": "c"}, None]}, "completions") == ["c"]
    assert generic_completions({"data": [{"t": ["z"]}]}, "data.0.t") == ["z"]


def test_requests_keep_order_across_items(fake_llm_server):
    client = make_client(fake_llm_server, max_concurrency=4)
    out = client.generate([req(f"item{i}", m=2, agent=i % 2) for i in range(6)])
    assert out == [[f"item{i}|0", f"item{i}|1"] for i in range(6)]


# --------------------------------------------------------------------------- openai chat


def test_openai_chat_batches_n_and_drops_nulls(fake_llm_server, monkeypatch):
    monkeypatch.setenv("OAI", KEY)
    fake_llm_server.texts = lambda proto, body, i: f"{body['messages'][0]['content']}|n{body['n']}|{i}"
    client = make_client(
        fake_llm_server,
        "openai",
        model="gpt-test",
        key_env="OAI",
        max_n_per_request=2,
        extra_body={"seed": 1, "max_tokens": 8},
    )
    out = client.generate([req("hi", m=5, top_p=None)])
    assert out == [["hi|n2|0", "hi|n2|1", "hi|n2|0", "hi|n2|1", "hi|n1|0"]]
    assert sorted(r.body["n"] for r in fake_llm_server.requests) == [1, 2, 2]
    body = fake_llm_server.requests[0].body
    assert {k: v for k, v in body.items() if k != "n"} == {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "temperature": 0.6,
        "seed": 1,
    }  # top_p=None dropped, no top_k
    assert all(r.path == "/v1/chat/completions" for r in fake_llm_server.requests)
    assert fake_llm_server.requests[0].headers["authorization"] == f"Bearer {KEY}"


def test_openai_chat_one_request_when_unbounded(fake_llm_server):
    assert make_client(fake_llm_server, "openai", model="m").generate([req(m=4)]) == [
        ["p|0", "p|1", "p|2", "p|3"]
    ]
    assert [r.body["n"] for r in fake_llm_server.requests] == [4]


def test_openai_chat_deepseek_defaults_to_n_1(fake_llm_server):
    client = make_client(fake_llm_server, "openai", model="deepseek-chat")
    assert client.generate([req(m=3)]) == [["p|0"] * 3]
    assert [r.body["n"] for r in fake_llm_server.requests] == [1, 1, 1]
    by_url = APIComparatorClient(url="https://api.deepseek.com/chat/completions", format="openai", model="x")
    assert by_url._chunk_sizes(3) == [1, 1, 1]
    assert APIComparatorClient(url="http://h/x", format="chat", max_n_per_request=9)._chunk_sizes(4) == [4]


def test_openai_prefers_message_content_then_text(fake_llm_server):
    client = make_client(fake_llm_server, "openai")
    assert client._extract({"choices": [{"message": {"content": "a"}}, {"text": "b"}, {"message": {}}]}) == [
        "a",
        "b",
    ]


# --------------------------------------------------------------------------- anthropic


def test_anthropic_one_request_per_candidate_with_native_headers(fake_llm_server, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    fake_llm_server.always(completions(2))  # two text blocks: only the first one counts
    client = make_client(fake_llm_server, "anthropic", model="claude-test", extra_body={"top_k": 4})
    assert client.generate([req("hey", m=3, top_k=99)]) == [["hey|0"] * 3]
    assert len(fake_llm_server.requests) == 3
    for record in fake_llm_server.requests:
        assert record.path == "/v1/messages"
        assert record.body == {
            "model": "claude-test",
            "max_tokens": 256,
            "messages": [{"role": "user", "content": "hey"}],
            "temperature": 0.6,
            "top_k": 4,  # only via extra_body
        }
        assert record.headers["x-api-key"] == KEY  # Authorization remapped, Bearer dropped
        assert "authorization" not in record.headers
        assert record.headers["anthropic-version"] == "2023-06-01"


def test_anthropic_custom_key_env_header_and_version(fake_llm_server, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "wrong")
    monkeypatch.setenv("OTHER_KEY", KEY)
    client = make_client(
        fake_llm_server,
        "anthropic",
        key_env="OTHER_KEY",
        key_header="X-Key",
        key_prefix="Token",
        headers={"Anthropic-Version": "2099-01-01"},
    )
    client.generate([req(m=1)])
    (record,) = fake_llm_server.requests
    assert record.headers["x-key"] == f"Token {KEY}"
    assert record.headers["anthropic-version"] == "2099-01-01"
    assert "x-api-key" not in record.headers


def test_key_is_read_at_request_time(fake_llm_server, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    client = make_client(fake_llm_server, "anthropic")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "first")
    client.generate([req(m=1)])
    monkeypatch.setenv("ANTHROPIC_API_KEY", "second")
    client.generate([req(m=1)])
    assert [r.headers["x-api-key"] for r in fake_llm_server.requests] == ["first", "second"]


# --------------------------------------------------------------------------- openai responses


def test_responses_body_and_output_text(fake_llm_server):
    client = make_client(fake_llm_server, "codex", model="gpt-5-codex", key=KEY, key_prefix=" ")
    assert client.generate([req("do", m=2, max_new_tokens=32)]) == [["do|0", "do|0"]]
    assert len(fake_llm_server.requests) == 2
    for record in fake_llm_server.requests:
        assert record.path == "/v1/responses"
        assert record.body == {"model": "gpt-5-codex", "input": "do", "max_output_tokens": 32}
        assert record.headers["authorization"] == KEY  # blank prefix: the bare key


# --------------------------------------------------------------------------- faults


def test_timeout_is_retried_then_succeeds(fake_llm_server, caplog):
    # The slow answer always times out (the server sleeps 3 s after the request left); the retry's normal
    # answer gets a second, far more than a loopback answer needs even on a loaded machine.
    fake_llm_server.enqueue(slow(3.0))
    client = make_client(fake_llm_server, timeout=1.0)
    with caplog.at_level(logging.WARNING):
        assert client.generate([req(m=2)]) == [["p|0", "p|1"]]
    assert len(fake_llm_server.requests) == 2
    # the total deadline (= timeout) usually fires just before the per-read timeout
    assert ("ReadTimeout" in caplog.text or "total deadline of 1 s" in caplog.text) and "retry 1/2" in caplog.text


def test_timeouts_exhaust_retries(fake_llm_server):
    fake_llm_server.always(slow(0.6))
    client = make_client(fake_llm_server, timeout=0.15, max_retries=1)
    with pytest.raises(APIComparatorError) as info:
        client.generate([req(m=1)])
    error = info.value
    assert error.status is None and error.attempts == 2 and len(fake_llm_server.requests) == 2
    assert fake_llm_server.url() in str(error) and "no response" in str(error)


def test_connection_refused_is_retried_then_reported():
    with socket.socket() as sock:  # a free loopback port with nobody listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = APIComparatorClient(url=f"http://127.0.0.1:{port}/generic", max_retries=1, backoff_base_s=0.01)
    with pytest.raises(APIComparatorError, match=f"127.0.0.1:{port}/generic.*ConnectError") as info:
        client.generate([req(m=1)])
    assert info.value.attempts == 2


def test_429_honours_retry_after(fake_llm_server, caplog):
    fake_llm_server.enqueue(rate_limited(0.2))
    client = make_client(fake_llm_server, backoff_base_s=0.001, backoff_max_s=1.0)
    with caplog.at_level(logging.WARNING):
        assert client.generate([req(m=1)]) == [["p|0"]]
    first, second = fake_llm_server.requests
    assert second.started - first.finished >= 0.19  # the back-off alone would be ~1 ms
    assert "HTTP 429" in caplog.text and "in 0.20 s" in caplog.text


def test_429_forever_reports_status(fake_llm_server):
    fake_llm_server.always(rate_limited(0))
    with pytest.raises(APIComparatorError, match="HTTP 429") as info:
        make_client(fake_llm_server, max_retries=3).generate([req(m=1)])
    assert info.value.status == 429 and info.value.attempts == 4 and len(fake_llm_server.requests) == 4


def test_5xx_is_retried_then_succeeds(fake_llm_server):
    fake_llm_server.enqueue(http_error(500), http_error(503))
    assert make_client(fake_llm_server).generate([req(m=1)]) == [["p|0"]]
    assert len(fake_llm_server.requests) == 3


def test_5xx_forever_names_endpoint_status_and_body(fake_llm_server):
    fake_llm_server.always(http_error(502, '{"error": "upstream exploded"}'))
    with pytest.raises(APIComparatorError) as info:
        make_client(fake_llm_server, "openai", max_retries=2).generate([req(m=1)])
    message = str(info.value)
    assert (
        fake_llm_server.url("openai") in message and "HTTP 502" in message and "upstream exploded" in message
    )
    assert info.value.attempts == 3 and len(fake_llm_server.requests) == 3


@pytest.mark.parametrize(
    ("status", "extra"), [(400, ""), (401, ""), (404, ""), (402, "insufficient balance")]
)
def test_client_errors_fail_at_once(fake_llm_server, status, extra):
    fake_llm_server.always(http_error(status, '{"error": "nope"}'))
    with pytest.raises(APIComparatorError, match=f"HTTP {status}") as info:
        make_client(fake_llm_server, "anthropic").generate([req(m=1)])
    assert info.value.status == status and info.value.endpoint == fake_llm_server.url("anthropic")
    assert "nope" in str(info.value) and extra in str(info.value)
    assert len(fake_llm_server.requests) == 1


def test_malformed_json_is_retried_then_succeeds(fake_llm_server):
    fake_llm_server.enqueue(malformed_json())
    assert make_client(fake_llm_server).generate([req(m=2)]) == [["p|0", "p|1"]]
    assert len(fake_llm_server.requests) == 2


def test_malformed_json_forever_is_reported(fake_llm_server):
    fake_llm_server.always(malformed_json())
    with pytest.raises(APIComparatorError, match="non-JSON.*unterminated") as info:
        make_client(fake_llm_server, max_retries=1).generate([req(m=2)])
    assert info.value.status == 200 and len(fake_llm_server.requests) == 2


def test_too_few_completions_asks_for_the_rest(fake_llm_server):
    fake_llm_server.enqueue(completions(1))
    assert make_client(fake_llm_server).generate([req(m=3)]) == [["p|0", "p|0", "p|1"]]
    assert [r.body["num_return_sequences"] for r in fake_llm_server.requests] == [3, 2]


def test_too_few_completions_forever_is_reported(fake_llm_server):
    fake_llm_server.always(completions(1))  # an endpoint that ignores n
    with pytest.raises(APIComparatorError, match="2 of 3 completion") as info:
        make_client(fake_llm_server, "openai", max_retries=1).generate([req(m=3)])
    assert "comparator_api_max_n_per_request=1" in str(info.value)
    assert [r.body["n"] for r in fake_llm_server.requests] == [3, 2]


def test_single_completion_format_with_empty_answer_is_retried(fake_llm_server):
    fake_llm_server.enqueue(completions(0))
    assert make_client(fake_llm_server, "responses").generate([req(m=1)]) == [["p|0"]]
    assert len(fake_llm_server.requests) == 2


def test_too_many_completions_are_truncated_with_a_warning(fake_llm_server, caplog):
    fake_llm_server.enqueue(completions(5))
    with caplog.at_level(logging.WARNING):
        assert make_client(fake_llm_server).generate([req(m=3)]) == [["p|0", "p|1", "p|2"]]
    assert "returned 5 completions where 3 were requested" in caplog.text
    assert len(fake_llm_server.requests) == 1


def test_one_failing_item_fails_the_call(fake_llm_server):
    fake_llm_server.enqueue(http_error(403))
    with pytest.raises(APIComparatorError, match="HTTP 403"):
        make_client(fake_llm_server, max_concurrency=1).generate([req("a", m=1), req("b", m=1)])
    assert len(fake_llm_server.requests) == 1


# --------------------------------------------------------------------------- concurrency


@pytest.mark.parametrize(("fmt", "limit"), [("generic", 3), ("anthropic", 2)])
def test_concurrency_limit_is_respected(fake_llm_server, fmt, limit):
    # Concurrency is shown by the server's in-flight count, not by wall-clock time (which load stretches).
    fake_llm_server.always(slow(0.3))
    client = make_client(fake_llm_server, fmt, max_concurrency=limit)
    out = client.generate([req(f"i{i}", m=2 if fmt == "anthropic" else 1) for i in range(6)])
    assert fake_llm_server.max_in_flight == limit  # reached, never exceeded
    assert len(fake_llm_server.requests) == (12 if fmt == "anthropic" else 6)
    assert [len(texts) for texts in out] == [2 if fmt == "anthropic" else 1] * 6


# --------------------------------------------------------------------------- the key stays secret


def _assert_secret(*texts):
    for text in texts:
        assert KEY not in (text if isinstance(text, str) else text.decode("latin-1"))


def test_literal_key_never_leaks(fake_llm_server, caplog):
    echo = f'{{"error": "invalid key Bearer {KEY}"}}'  # a server that echoes the credential
    fake_llm_server.enqueue(http_error(500, echo), rate_limited(0))
    fake_llm_server.always(http_error(401, echo))
    client = make_client(fake_llm_server, key=KEY)
    with caplog.at_level(logging.DEBUG), pytest.raises(APIComparatorError) as info:
        client.generate([req(m=1)])
    error = info.value
    assert fake_llm_server.requests[0].headers["authorization"] == f"Bearer {KEY}"  # it was sent
    assert "***" in str(error) and error.status == 401
    _assert_secret(
        caplog.text,
        str(error),
        repr(error),
        error.body_excerpt,
        pickle.dumps(error),
        repr(client),
        str(vars(client)),
        pickle.dumps(client),
    )
    assert "key='literal'" in repr(client)


def test_env_key_never_leaks(fake_llm_server, caplog, monkeypatch):
    monkeypatch.setenv("SECRET_ENV", KEY)
    fake_llm_server.always(malformed_json())
    fake_llm_server.enqueue(http_error(503, f"echo {KEY}"))
    client = make_client(fake_llm_server, "openai", key_env="SECRET_ENV", max_retries=1)
    with caplog.at_level(logging.DEBUG), pytest.raises(APIComparatorError) as info:
        client.generate([req(m=1)])
    _assert_secret(caplog.text, str(info.value), repr(client), pickle.dumps(client), str(vars(client)))
    assert "env:SECRET_ENV" in repr(client)


def test_unpickled_client_does_not_carry_a_literal_key(fake_llm_server, monkeypatch):
    monkeypatch.delenv("FALLBACK_KEY", raising=False)
    client = make_client(fake_llm_server, key=KEY, key_env="FALLBACK_KEY")
    for clone in (pickle.loads(pickle.dumps(client)), copy.deepcopy(client)):
        with pytest.raises(APIComparatorError, match="never pickled") as info:
            clone.generate([req(m=1)])
        _assert_secret(str(info.value))
        monkeypatch.setenv("FALLBACK_KEY", "from-env")
        assert clone.generate([req(m=1)]) == [["p|0"]]
        monkeypatch.delenv("FALLBACK_KEY")
    assert [r.headers["authorization"] for r in fake_llm_server.requests] == ["Bearer from-env"] * 2
    assert client.generate([req(m=1)]) == [["p|0"]]  # the original keeps its key
    assert fake_llm_server.requests[-1].headers["authorization"] == f"Bearer {KEY}"
