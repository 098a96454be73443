"""Code-environment items of docs/coming-from-comlrl.md: the default expert of expert_edits, plain mode's
history, CoMLRL's ``external.*`` config keys."""

from __future__ import annotations

import pytest

from comlrl_lightning.data.task import TaskDataModule
from comlrl_lightning.envs.code import FORMATTERS, code_reward_func, make_code_transition

ITEM = {"task_id": "t/0", "entry_point": "sum_sq",
        "prompt": 'def sum_sq(nums):\n    """Return the sum of the squares of nums."""\n',
        "test": "def check(candidate):\n    assert candidate([1, 2]) == 5\n"}
AUX = "def aux(x):\n    return x\n"
MAIN = f"def {ITEM['entry_point']}(*args):\n    return aux(args)\n"
pytestmark = pytest.mark.sandbox  # every code transition checks at construction that the sandbox can run
EXPERT_VARS = ("EXPERT_API_URL", "EXPERT_API_KEY", "DEEPSEEK_API_KEY", "ANTHROPIC_API_KEY", "DASHSCOPE_API_KEY",
               "OPENAI_API_KEY")


@pytest.fixture
def no_expert_env(monkeypatch):
    for var in EXPERT_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_default_expert_without_a_key_names_what_to_set(no_expert_env):
    with pytest.raises(ValueError, match="DEEPSEEK_API_KEY") as err:
        make_code_transition("expert_edits")
    assert "EXPERT_API_KEY" in str(err.value) and "client=" in str(err.value)
    with pytest.raises(ValueError, match="EXPERT_API_URL"):
        make_code_transition("expert_edits", expert_model="my-local-coder")


def test_default_expert_is_deepseek_coder_through_the_http_client(no_expert_env):
    no_expert_env.setenv("DEEPSEEK_API_KEY", "sk-test")
    client = make_code_transition("expert_edits").client.client
    assert (client.url, client.format, client.model, client.key_env) == (
        "https://api.deepseek.com/v1/chat/completions", "openai", "deepseek-coder", "DEEPSEEK_API_KEY")
    no_expert_env.setenv("ANTHROPIC_API_KEY", "sk-test")
    claude = make_code_transition("expert", expert_model="claude-sonnet-4").client.client
    assert (claude.format, claude.key_env) == ("anthropic", "ANTHROPIC_API_KEY")


def test_gpt_experts_go_to_openai_chat_completions_with_openai_api_key(no_expert_env):
    from fake_llm_server import FakeLLMServer

    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        make_code_transition("expert_edits", expert_model="gpt-4o-mini")
    no_expert_env.setenv("OPENAI_API_KEY", "sk-openai-test-key")
    client = make_code_transition("expert_edits", expert_model="gpt-4o-mini").client.client
    assert (client.url, client.format, client.model, client.key_env) == (
        "https://api.openai.com/v1/chat/completions", "openai", "gpt-4o-mini", "OPENAI_API_KEY")
    server = FakeLLMServer().start()  # the same route, answered on loopback (EXPERT_API_URL replaces the URL)
    try:
        server.texts = lambda protocol, body, i: '{"aux": "Square x.", "main": "Call aux."}'
        no_expert_env.setenv("EXPERT_API_URL", server.url("openai"))
        t = make_code_transition("expert_edits", problems=[ITEM], expert_model="gpt-4o-mini")
        aux_p, _ = t(ITEM["prompt"], [AUX, MAIN], 2)
    finally:
        server.stop()
    assert aux_p.endswith("Here is the feedback from an expert:\nSquare x.")
    assert server.requests[-1].body["model"] == "gpt-4o-mini"
    assert server.requests[-1].headers["authorization"] == "Bearer sk-openai-test-key"


def test_openai_compatible_expert_from_the_environment(no_expert_env):
    no_expert_env.setenv("EXPERT_API_URL", "http://127.0.0.1:9/v1/chat/completions")
    no_expert_env.setenv("EXPERT_API_KEY", "sk-test")
    client = make_code_transition("expert_edits", expert_model="my-local-coder").client.client
    assert (client.url, client.key_env, client.model) == (
        "http://127.0.0.1:9/v1/chat/completions", "EXPERT_API_KEY", "my-local-coder")


def test_plain_follow_ups_carry_the_prompt_and_response_history():
    t = make_code_transition("plain", problems=[ITEM])
    aux_p, main_p = t(ITEM["prompt"], [AUX, MAIN], 2, prompt_history_per_agent=[["first aux prompt"], ["first main"]],
                      response_history_per_agent=[["old aux code"], ["old main code"]])
    assert "History: previous prompts" in aux_p and "first aux prompt" in aux_p and "old aux code" in aux_p
    assert "first main" in main_p and "old main code" in main_p and "old aux code" not in main_p
    assert "Your previous aux(...) implementation:" in aux_p
    assert "History" not in make_code_transition("plain", problems=[ITEM], include_history=False)(
        ITEM["prompt"], [AUX, MAIN], 2, [["p"], ["q"]], [["r"], ["s"]])[0]


def test_comlrl_external_config_keys_select_the_mode():
    dm = TaskDataModule(train_dataset=[ITEM], eval_dataset=None, reward_func=code_reward_func,
                        formatters=FORMATTERS, external={"mode": "plain", "previous_response": False,
                                                         "original_prompt": True, "sandbox_slice": "all"})
    t = dm.external_transition
    assert (t.mode, t.previous_response_flag, t.original_prompt_flag, t.sandbox_slice) == ("plain", False, True, 0)
    with pytest.raises(ValueError, match="not both"):
        TaskDataModule(train_dataset=[ITEM], reward_func=code_reward_func, formatters=FORMATTERS,
                       external={"mode": "plain"}, external_transition_options={"mode": "plain"})
