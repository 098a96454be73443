"""HTTP comparator (``comparator_policy='api'``, docs/preference.md §6, docs/decisions.md, decision 8): candidates from
an external LLM endpoint.

Three parts, one file each:

* :mod:`~comlrl_lightning.comparators.api_formats`: the wire formats (``generic``, ``openai``,
  ``anthropic``, ``openai_responses``): request bodies, headers, response parsing;
* :mod:`~comlrl_lightning.comparators.api_client`: :class:`APIComparatorClient`, the HTTP client (retries
  with back-off and ``Retry-After``, concurrency, completion counts, key hygiene), built on
  :mod:`~comlrl_lightning.comparators.api_transport`;
* here: :class:`APIComparator`, the comparator source that asks the client for every agent's candidates.

The names of the client and the formats are re-exported, so ``comlrl_lightning.comparators.api`` stays
the one import path for all of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from comlrl_lightning.comparators.api_client import APIComparatorClient
from comlrl_lightning.comparators.api_formats import (
    API_FORMAT_ALIASES,
    CompletionRequest,
    generic_completions,  # noqa: F401 - re-exported for the tests of the generic format
    normalize_api_format,
)
from comlrl_lightning.comparators.api_transport import APIComparatorError
from comlrl_lightning.generation import Samples, SamplingSettings

__all__ = [
    "API_FORMAT_ALIASES",
    "APIComparator",
    "APIComparatorClient",
    "APIComparatorError",
    "CompletionRequest",
    "normalize_api_format",
]


class APIComparator:
    """Adapter from :class:`APIComparatorClient` to the comparator source protocol (see ``local.py``)."""

    policy = "api"

    def __init__(self, client: Any, request_cls: Any = CompletionRequest):
        self.client = client
        self.request_cls = request_cls
        self.settings: SamplingSettings | None = None

    @classmethod
    def from_config(cls, cfg: Any, model_config: dict | None = None) -> APIComparator:
        """The source of an iterative config's ``comparator_api_*`` options (``build_comparator``)."""
        return cls(APIComparatorClient.from_config(cfg))

    def setup(self, trainer: Any, pl_module: Any) -> None:
        """Once per fit: the learner's sampling settings (sent with every request) and this rank's share of the
        endpoint's concurrency. The module itself is not kept."""
        self.settings = pl_module.sampling_settings()
        # the ranks of a multi-process run query the endpoint at once: each gets an equal share of the run's
        # concurrency limit, at least 1 (docs/scaling.md, section 2.1)
        world_size = int(getattr(trainer, "world_size", 1) or 1)
        limit = getattr(self, "run_max_concurrency", None) or getattr(self.client, "max_concurrency", None)
        if world_size > 1 and isinstance(limit, int):  # (the run's limit is kept: setup runs once per fit)
            self.run_max_concurrency = limit
            self.client.max_concurrency = max(1, limit // world_size)

    def sample(self, prompts: Sequence[Sequence[str]], num_candidates: int,
               items: Sequence[dict] | None = None) -> list[Samples]:
        return [self.sample_agent(a, agent_prompts, num_candidates, items) for a, agent_prompts in enumerate(prompts)]

    def sample_agent(self, agent_index: int, prompts: Sequence[str], num_candidates: int,
                     items: Sequence[dict] | None = None) -> Samples:
        s = self.settings
        items = list(items) if items is not None else [{} for _ in prompts]
        reqs = [self.request_cls(prompt=p, agent_index=agent_index, item=items[k], num_candidates=num_candidates,
                                 max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                                 top_k=s.top_k) for k, p in enumerate(prompts)]
        texts = self.client.generate(reqs)
        for k, t in enumerate(texts):
            if not t:
                raise ValueError(f"Comparator API returned no completions for agent {agent_index} (task item {k}).")
        return Samples(prompt_ids=[[] for _ in texts], completion_ids=[[[] for _ in t] for t in texts],
                       texts=[list(t) for t in texts])

    def prepare(self, round_index: int) -> None:
        pass

    def release(self) -> None:
        pass

    def state_dict(self) -> dict:
        return {"policy": self.policy}

    def load_state_dict(self, state: dict) -> None:
        pass

