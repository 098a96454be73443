"""The reference engine: transformers ``generate`` on the team's live models (docs/engines.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from comlrl_lightning.engines.base import SampleRequest, sample_each
from comlrl_lightning.generation import Samples, SamplingSettings, SamplingStream, sample_completions


class HFEngine:
    """Samples agent i with :func:`~comlrl_lightning.generation.sample_completions` inside ``team.activate(i)``.

    It reads the live weights, so :meth:`sync` has nothing to do and there is nothing to close.

    Args:
        team: the :class:`~comlrl_lightning.agents.AgentTeam` served.
        max_batch_rows: rows (prompts x candidates) per ``generate`` call.
    """

    name = "hf"

    def __init__(self, team: Any, max_batch_rows: int = 256):
        self.team = team
        self.max_batch_rows = max_batch_rows

    def sample(self, agent_index: int, prompts: Sequence[str], num_candidates: int, settings: SamplingSettings,
               stream: SamplingStream) -> Samples:
        with self.team.activate(agent_index) as model:
            return sample_completions(model, self.team.tokenizers[agent_index], list(prompts), num_candidates,
                                      settings, stream, max_batch_rows=self.max_batch_rows)

    def sample_many(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> list[Samples]:
        return sample_each(self, requests, settings)

    def sync(self, agent_indices: Sequence[int] | None = None) -> None:
        """Nothing to do: ``generate`` runs on the live weights."""

    def close(self) -> None:
        """Nothing to release."""
