"""The expert model of ``expert_edits``, reached through the project's HTTP client.

``make_expert_client(url, ...)`` returns the ``client(messages) -> str`` callable that
:class:`~comlrl_lightning.envs.code.transitions.CodeTransition` expects. It reuses
:class:`~comlrl_lightning.comparators.api_client.APIComparatorClient`, so retries with back-off, Retry-After,
response checks and key hygiene (the key is read from ``key_env`` at request time and never logged) are
the same as for API comparators.
"""

from __future__ import annotations

from collections.abc import Callable

from comlrl_lightning.comparators.api_client import APIComparatorClient
from comlrl_lightning.comparators.api_formats import CompletionRequest


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
