"""One redaction path (issue 14, finding 7): keys in URLs, bodies and any header never leave a config."""

from __future__ import annotations

from comlrl_lightning.config import MADPOIterConfig, redact_secrets

KEY = "sk-PLANTED-0123456789"


def _cfg(**kw):
    return MADPOIterConfig(comparator_policy="api", comparator_api_url=f"http://u:{KEY}@127.0.0.1:1/v1?api-key={KEY}",
                           comparator_api_key=KEY, comparator_api_headers={"X-Api": KEY, "Accept": "application/json"},
                           comparator_api_extra_body={"user": KEY, "metadata": {"org": KEY}, "temperature": 0.5,
                                                      "model": "gpt-x"}, **kw)


def test_key_in_url_body_and_any_header_is_redacted_everywhere():
    cfg = _cfg()
    red = redact_secrets(cfg)
    for text in (repr(cfg), str(cfg.to_dict()), repr(red), str(redact_secrets({"args": cfg.to_dict()}))):
        assert KEY not in text
    assert red.comparator_api_key is None
    assert red.comparator_api_headers == {"X-Api": "***", "Accept": "application/json"}
    assert red.comparator_api_url == "http://u:***@127.0.0.1:1/v1?api-key=***"
    assert red.comparator_api_extra_body == {"user": "***", "metadata": {"org": "***"}, "temperature": 0.5,
                                             "model": "gpt-x"}
    # the live config keeps its values: the comparator still needs them
    assert cfg.comparator_api_key == KEY and KEY in cfg.comparator_api_url


def test_api_client_arguments_and_namespaces_are_redacted():
    from jsonargparse import Namespace

    ns = Namespace(comparator=Namespace(class_path="x.APIClient", init_args=Namespace(
        url=f"http://h/v1?k={KEY}", key=KEY, key_env="MY_KEY", headers={"X-K": KEY}, extra_body={"u": KEY})))
    out = redact_secrets(ns)
    assert KEY not in str(out)
    assert out.comparator.init_args.key_env == "MY_KEY"  # env-var names are kept: the key is read at request time
    assert KEY in str(ns)  # a copy: the parsed config is untouched


def test_env_var_indirection_survives_redaction(monkeypatch):
    monkeypatch.setenv("PLANTED_ENV_KEY", KEY)
    cfg = MADPOIterConfig(comparator_policy="api", comparator_api_url="http://127.0.0.1:1/v1",
                          comparator_api_key_env="PLANTED_ENV_KEY")
    assert redact_secrets(cfg).comparator_api_key_env == "PLANTED_ENV_KEY"
    assert KEY not in repr(cfg)
