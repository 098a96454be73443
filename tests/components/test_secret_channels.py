"""Keys in every channel (issue 31, item 6): echoed response bodies in any case or encoding, httpx's and httpcore's
log lines, URL credentials, and the CLI's command line and parse errors (see also
tests/trainers/test_secret_scan.py for whole runs)."""

from __future__ import annotations

import base64
import logging
import traceback
from urllib.parse import quote

import pytest
from fake_llm_server import fake_llm_server, http_error, rate_limited  # noqa: F401 - fixture

from comlrl_lightning.comparators.api import APIComparatorClient, APIComparatorError, CompletionRequest
from comlrl_lightning.comparators.api_transport import redact_text, scrub
from comlrl_lightning.config.secrets import redact_argv, secret_values, secrets_in_argv

KEY = "sk-PLANTED-Echo/9f8e+7d6c5b4a"
HEADER_SECRET = "org-PLANTED-77aa88bb"


def _forms(secret: str) -> list[str]:
    """Every form a server may echo: as given, lower and upper case, URL-encoded, base64 (std and URL-safe), and
    inside Basic credentials."""
    b64 = base64.b64encode(secret.encode()).decode()
    return [secret, secret.lower(), secret.upper(), quote(secret, safe=""), quote(secret, safe="").lower(), b64,
            base64.urlsafe_b64encode(secret.encode()).decode(), base64.b64encode(f"user:{secret}".encode()).decode(),
            base64.b64encode(f"ab:{secret}".encode()).decode()]


def _leaks(text: str, secret: str = KEY) -> list[str]:
    """The forms of `secret` still in `text` (base64 forms by their secret-only middle part)."""
    left = []
    for form in _forms(secret):
        probe = form if form.lower().startswith(secret.lower()[:4]) or "%" in form else form[4:-4]
        if probe.lower() in text.lower():
            left.append(form)
    return left


def test_scrub_finds_every_form_of_a_secret():
    for form in _forms(KEY):
        text = f"error: the key {form} is invalid"
        assert _leaks(text), form  # the probe sees the form ...
        clean = scrub(text, {KEY})
        assert not _leaks(clean), (form, clean)  # ... and scrub removes it
        assert clean.startswith("error: the key ") and clean.endswith(" is invalid")
    assert scrub("nothing to hide here", {KEY}) == "nothing to hide here"
    assert scrub("a short abc value", {"abc"}) == "a short abc value"  # under MIN_SCRUB_CHARS: left alone
    assert redact_text(f"GET http://h:1/v1?api-key={KEY}&x=1 and http://u:{HEADER_SECRET}@h/p") == \
        "GET http://h:1/v1?api-key=***&x=*** and http://u:***@h/p"


@pytest.mark.parametrize("echo", _forms(KEY) + _forms(HEADER_SECRET))
def test_a_401_echoing_the_key_in_any_form_prints_none_of_them(fake_llm_server, echo):  # noqa: F811
    fake_llm_server.enqueue(http_error(401, f'{{"error": "invalid credentials {echo}"}}'))
    client = APIComparatorClient(url=fake_llm_server.url("openai"), format="openai", key=KEY, max_retries=0,
                                 headers={"X-Org-Ident": HEADER_SECRET})
    with pytest.raises(APIComparatorError) as info:
        client.generate([CompletionRequest(prompt="p", agent_index=0, num_candidates=1)])
    shown = "".join(traceback.format_exception(info.value)) + repr(info.value) + info.value.body_excerpt
    assert "HTTP 401" in shown and "invalid credentials" in shown
    assert not _leaks(shown, KEY) and not _leaks(shown, HEADER_SECRET), shown


def test_retried_echoes_are_scrubbed_in_the_final_error_and_the_retry_log(fake_llm_server, caplog):  # noqa: F811
    fake_llm_server.always(http_error(503, f"down, key was {KEY.upper()}"))
    client = APIComparatorClient(url=fake_llm_server.url("openai"), format="openai", key=KEY, max_retries=1,
                                 backoff_base_s=0.0)
    with caplog.at_level(logging.DEBUG), pytest.raises(APIComparatorError) as info:
        client.generate([CompletionRequest(prompt="p", agent_index=0, num_candidates=1)])
    assert "down, key was ***" in str(info.value)
    assert not _leaks(str(info.value) + caplog.text)


def test_httpx_and_httpcore_log_lines_carry_no_url_credentials(fake_llm_server, monkeypatch):  # noqa: F811
    """httpx logs each request's URL at INFO (and httpcore its steps at DEBUG): a handler on the root logger sees
    the query values and the env key as ***."""
    monkeypatch.setenv("PLANTED_ENV_KEY", KEY)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(self.format(record))

    handler = Keep(level=logging.DEBUG)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        client = APIComparatorClient(url=fake_llm_server.url("openai", query=f"api-key={KEY}&other={HEADER_SECRET}"),
                                     format="openai", key_env="PLANTED_ENV_KEY", max_retries=0)
        assert client.generate([CompletionRequest(prompt="p", agent_index=0, num_candidates=1)]) == [["p|0"]]
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    text = "\n".join(records)
    assert "HTTP Request: POST" in text and "api-key=***" in text, text  # the line is there, cleaned
    assert not _leaks(text) and not _leaks(text, HEADER_SECRET), text
    assert fake_llm_server.requests[-1].headers["authorization"] == f"Bearer {KEY}"  # the request itself is intact


def test_url_credentials_are_refused_without_printing_them():
    for url, why in ((f"http://user:{HEADER_SECRET}@127.0.0.1:1/v1", "must not carry credentials"),
                     (f"http://user:{KEY}@127.0.0.1:1/v1", "not a valid http")):  # the '/' in KEY ends the host
        with pytest.raises(ValueError, match=why) as info:
            APIComparatorClient(url=url, format="openai")
        shown = "".join(traceback.format_exception(info.value))
        assert not _leaks(shown, HEADER_SECRET) and "PLANTED" not in shown and "comparator_api_key_env" in shown


def test_retry_after_nan_and_deep_json_end_in_api_errors(fake_llm_server):  # noqa: F811
    from fake_llm_server import Fault

    fake_llm_server.enqueue(rate_limited("NaN"))  # was a bare ValueError from the sleep
    client = APIComparatorClient(url=fake_llm_server.url("openai"), format="openai", key=KEY, max_retries=1,
                                 backoff_base_s=0.0)
    assert client.generate([CompletionRequest(prompt="p", agent_index=0, num_candidates=1)]) == [["p|0"]]
    fake_llm_server.enqueue(Fault(body="[" * 100_000 + "]" * 100_000))  # was a raw RecursionError
    with pytest.raises(APIComparatorError, match="nests JSON deeper"):
        client.generate([CompletionRequest(prompt="p", agent_index=0, num_candidates=1)])


def test_secrets_are_collected_from_command_lines_and_configs(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(f"model:\n  init_args:\n    args:\n      init_args:\n        comparator_api_key: {KEY}\n"
                      f"        comparator_api_headers: {{X-Org: {HEADER_SECRET}, Accept: application/json}}\n")
    argv = ["fit", "--config", str(config), f"--model.init_args.args.init_args.comparator_api_key={KEY}x",
            "--model.init_args.args.init_args.comparator_api_extra_body", "sk-body-as-a-string",
            "--data.init_args.url", f"http://h/v1?k={KEY}y", "--trainer.max_epochs=2",
            '--model.args={"init_args": {"comparator_api_extra_body": {"user": "inline-user-1", "model": "gpt-x"}}}']
    found = secrets_in_argv(argv)
    assert {KEY, HEADER_SECRET, KEY + "x", "sk-body-as-a-string", KEY + "y", "inline-user-1"} <= found
    assert not found & {"application/json", "gpt-x", "2", str(config)}
    red = redact_argv(argv)
    assert "--trainer.max_epochs=2" in red and str(config) in red and not any(KEY in a for a in red), red
    assert secret_values({"comparator_api_url": "http://u:pw-secret@h/v1?a=b123456", "key_env": "MY_KEY"}) == \
        {"pw-secret", "b123456"}
