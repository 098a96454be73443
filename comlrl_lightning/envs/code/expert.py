"""The expert model of ``expert_edits``, reached through the project's HTTP client.

``make_expert_client(url, ...)`` returns the ``client(messages) -> str`` callable that
:class:`~comlrl_lightning.envs.code.transitions.CodeTransition` expects. It reuses
:class:`~comlrl_lightning.comparators.api_client.APIComparatorClient`, so retries with back-off, Retry-After,
response checks and key hygiene (the key is read from ``key_env`` at request time and never logged) are
the same as for API comparators.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from comlrl_lightning.comparators.api_client import APIComparatorClient
from comlrl_lightning.comparators.api_formats import CompletionRequest
from comlrl_lightning.comparators.api_transport import endpoint_of

DEFAULT_EXPERT_MODEL = "deepseek-coder"
#: expert_model substring -> (OpenAI-compatible or Anthropic endpoint, format, key variable), as CoMLRL's router
_BACKENDS = (
    ("claude", "https://api.anthropic.com/v1/messages", "anthropic", "ANTHROPIC_API_KEY"),
    ("deepseek", "https://api.deepseek.com/v1/chat/completions", "openai", "DEEPSEEK_API_KEY"),
    ("qwen3-coder", "https://dashscope.aliyuncs.com/compatible-mode/v1/chat/completions", "openai",
     "DASHSCOPE_API_KEY"),
    ("gpt", "https://api.openai.com/v1/chat/completions", "openai", "OPENAI_API_KEY"),
)


def default_expert(model: str | None = None, url: str | None = None, format: str | None = None,
                   key_env: str | None = None) -> tuple[str, str, str | None, str]:
    """(url, format, key variable, model) of the expert: the given values, else the backend that
    ``expert_model`` (default ``deepseek-coder``) names, else ``EXPERT_API_URL`` / ``EXPERT_API_KEY``
    (OpenAI-compatible). With an explicit ``url`` only ``key_env`` is used (it may be None: no key). Raises
    ValueError naming what to set when no endpoint or no key is available."""
    model = model or DEFAULT_EXPERT_MODEL
    if url:  # an explicit endpoint: its key (if any) comes from key_env, as for every API client
        return url, format or "openai", key_env, model
    backend = next((b for b in _BACKENDS if b[0] in model.lower()), None)
    url = url or os.environ.get("EXPERT_API_URL") or (backend[1] if backend else None)
    fmt = format or (backend[2] if backend else "openai")
    key_env = key_env or ("EXPERT_API_KEY" if os.environ.get("EXPERT_API_KEY") else
                          (backend[3] if backend else "EXPERT_API_KEY"))
    if not url:
        raise ValueError(f"expert_edits: no endpoint for expert_model={model!r}. Set EXPERT_API_URL (an "
                         "OpenAI-compatible chat-completions URL) and EXPERT_API_KEY, pass expert_url=..., or pass "
                         "client=<callable(messages) -> str>.")
    if not os.environ.get(key_env):
        raise ValueError(f"expert_edits: the expert {model!r} at {endpoint_of(url)} needs an API key in the "
                         f"environment variable {key_env}; set {key_env} (or EXPERT_API_KEY), pass "
                         "expert_key_env=<variable>, or pass client=<callable(messages) -> str>.")
    return url, fmt, key_env, model


def make_expert_client(
    url: str,
    *,
    format: str = "openai",
    model: str | None = None,
    key_env: str | None = None,
    timeout: float = 60.0,
    max_retries: int = 2,
    max_new_tokens: int = 512,
    temperature: float | None = 0.2,
    **client_options,
) -> Callable[[list[dict]], str]:
    """A ``client(messages) -> str`` for the expert model at ``url`` (chat messages are joined into one
    user prompt: system text first, then the user turns, separated by blank lines)."""
    client = APIComparatorClient(url=url, format=format, model=model, key_env=key_env, timeout=timeout,
                                 max_retries=max_retries, **client_options)

    def ask(messages: list[dict]) -> str:
        prompt = "\n\n".join(str(m.get("content", "")) for m in messages if m.get("content"))
        request = CompletionRequest(prompt=prompt, agent_index=0, num_candidates=1,
                                    max_new_tokens=max_new_tokens, temperature=temperature, top_p=None, top_k=None)
        return client.generate([request])[0][0]

    ask.client = client  # for closing / inspection
    return ask
