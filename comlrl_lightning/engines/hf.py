"""The reference engine: transformers ``generate`` on the team's live models (docs/engines.md).

:meth:`HFEngine.sample_many` is where the agents' calls of one level are dispatched; with ``overlap`` they run
at the same time, one worker thread per group (docs/architecture.md, "Devices").
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from comlrl_lightning.devices import device_of, normalize_agent_overlap, overlap_groups
from comlrl_lightning.engines.base import SampleRequest, sample_each
from comlrl_lightning.generation import (
    Samples,
    SamplingSettings,
    SamplingStream,
    sample_completions,
    uses_own_generator,
)
from comlrl_lightning.overlap import MainThread, run_jobs


class HFEngine:
    """Samples agent i with :func:`~comlrl_lightning.generation.sample_completions` inside ``team.activate(i)``.

    It reads the live weights, so :meth:`sync` has nothing to do and there is nothing to close.

    Args:
        team: the :class:`~comlrl_lightning.agents.AgentTeam` served.
        max_batch_rows: rows (prompts x candidates) per ``generate`` call.
        overlap: the ``agent_overlap`` option: "auto", "on" or "off" (:meth:`workers`).
    """

    name = "hf"

    def __init__(self, team: Any, max_batch_rows: int = 256, overlap: Any = "auto"):
        self.overlap = normalize_agent_overlap(overlap)
        self.team = team
        self.applied = [0] * team.num_agents  # syncs per agent: the live weights include every one at once
        self.max_batch_rows = max_batch_rows

    def sample(self, agent_index: int, prompts: Sequence[str], num_candidates: int, settings: SamplingSettings,
               stream: SamplingStream) -> Samples:
        with self.team.activate(agent_index) as model:
            out = sample_completions(model, self.team.tokenizers[agent_index], list(prompts), num_candidates,
                                     settings, stream, max_batch_rows=self.max_batch_rows)
        out.version = self.applied[agent_index]
        return out

    def workers(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> list[list[int]]:
        """The requests grouped by the thread that serves them (:func:`~comlrl_lightning.devices.overlap_groups`
        of the agents' devices and models under ``overlap``): one group means one after another. Always one
        group when a model samples from the global RNG (:func:`~comlrl_lightning.generation.uses_own_generator`),
        whose draws would then depend on the threads' timing."""
        models = [self.team.models[r.agent_index] for r in requests]
        if self.overlap == "off" or len(requests) < 2 or not all(uses_own_generator(m, settings) for m in models):
            return [list(range(len(requests)))]
        return overlap_groups([device_of(m) for m in models], models, self.overlap)

    def sample_many(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> list[Samples]:
        """One :class:`Samples` per request, in request order. Requests of different :meth:`workers` groups run
        at the same time, one thread per group (:func:`~comlrl_lightning.overlap.run_jobs`); each agent draws from
        its own stream, so the result equals calling :meth:`sample` on each request in turn."""
        groups = self.workers(requests, settings)
        if len(groups) < 2:
            return sample_each(self, requests, settings)
        jobs = [functools.partial(self._serve, r, settings) for r in requests]
        devices = [device_of(self.team.models[r.agent_index]) for r in requests]
        return run_jobs(jobs, groups, devices)

    def _serve(self, request: SampleRequest, settings: SamplingSettings, main: MainThread) -> Samples:
        return self.sample(request.agent_index, request.prompts, request.num_candidates, settings, request.stream)

    def weight_version(self, agent_index: int) -> int:
        """The number of weight updates of agent ``agent_index`` the engine was told about (:meth:`sync`)."""
        return self.applied[agent_index]

    def sync(self, agent_indices: Sequence[int] | None = None) -> None:
        """Nothing to load: ``generate`` runs on the live weights; only the agents' weight versions advance."""
        for i in range(self.team.num_agents) if agent_indices is None else agent_indices:
            self.applied[i] += 1

    def close(self) -> None:
        """Nothing to release."""

