"""The generation engine interface (docs/engines.md): every completion the package samples goes through one.

An engine serves the agents of one :class:`~comlrl_lightning.agents.AgentTeam`. A caller names the agent, the
prompts, the number of candidates per prompt and the :class:`~comlrl_lightning.generation.SamplingStream` the
randomness comes from; the engine returns :class:`~comlrl_lightning.generation.Samples` exactly as
:func:`~comlrl_lightning.generation.sample_completions` lays them out (prompt ids actually used, completion ids
trimmed at the first pad token, decoded texts).

Weight changes: after an optimizer step the caller says which agents changed with :meth:`sync`; an engine may
apply the change at once or lazily, before its next generation (both built-in engines are lazy, and the HF
engine needs nothing since it samples the live model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from comlrl_lightning.generation import Samples, SamplingSettings, SamplingStream


@dataclass
class SampleRequest:
    """One agent's share of a batched call: ``num_candidates`` completions for each of ``prompts``, drawn from
    ``stream`` (one draw per call, as :func:`~comlrl_lightning.generation.sample_completions` makes)."""

    agent_index: int
    prompts: Sequence[str]
    num_candidates: int
    stream: SamplingStream


@runtime_checkable
class GenerationEngine(Protocol):
    """What callers need from an engine."""

    def sample(self, agent_index: int, prompts: Sequence[str], num_candidates: int, settings: SamplingSettings,
               stream: SamplingStream) -> Samples:
        """``num_candidates`` completions per prompt from agent ``agent_index``."""
        ...

    def sample_many(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> list[Samples]:
        """One :class:`Samples` per request, in order; an engine may serve them in one batched call (vLLM: one
        mixed-adapter call for LoRA agents). Streams are drawn in request order, so the result equals calling
        :meth:`sample` on each request in turn."""
        ...

    def sync(self, agent_indices: Sequence[int] | None = None) -> None:
        """The weights of these agents (None: all) changed; the next generation must use the new ones."""
        ...

    def close(self) -> None:
        """Release processes, memory and files; the engine may start again on its next call."""
        ...


def sample_each(engine: Any, requests: Sequence[SampleRequest], settings: SamplingSettings) -> list[Samples]:
    """``sample_many`` by calling ``engine.sample`` on each request in order (for engines without batching)."""
    return [engine.sample(r.agent_index, r.prompts, r.num_candidates, settings, r.stream) for r in requests]
