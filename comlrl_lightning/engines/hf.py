"""The reference engine: transformers ``generate`` on the team's live models (docs/engines.md).

:meth:`HFEngine.sample_many` is where the agents' calls of one level are dispatched; with ``overlap`` they run
at the same time in a small thread pool (docs/architecture.md, "Devices").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import torch

from comlrl_lightning.devices import device_of, normalize_agent_overlap, overlap_groups
from comlrl_lightning.engines.base import SampleRequest, sample_each
from comlrl_lightning.generation import (
    Samples,
    SamplingSettings,
    SamplingStream,
    sample_completions,
    uses_own_generator,
)


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
        self.team = team
        self.max_batch_rows = max_batch_rows
        self.overlap = normalize_agent_overlap(overlap)

    def sample(self, agent_index: int, prompts: Sequence[str], num_candidates: int, settings: SamplingSettings,
               stream: SamplingStream) -> Samples:
        with self.team.activate(agent_index) as model:
            return sample_completions(model, self.team.tokenizers[agent_index], list(prompts), num_candidates,
                                      settings, stream, max_batch_rows=self.max_batch_rows)

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
        at the same time, one thread per group; each agent draws from its own stream, so the result equals
        calling :meth:`sample` on each request in turn."""
        groups = self.workers(requests, settings)
        if len(groups) < 2:
            return sample_each(self, requests, settings)
        out: list[Any] = [None] * len(requests)

        def serve(group: list[int]) -> None:
            for i in group:
                r = requests[i]
                out[i] = self.sample(r.agent_index, r.prompts, r.num_candidates, settings, r.stream)

        context = _thread_context()
        with ThreadPoolExecutor(max_workers=len(groups), thread_name_prefix="agent-overlap") as pool:
            futures = [pool.submit(context, serve, g, device_of(self.team.models[requests[g[0]].agent_index]))
                       for g in groups]
            wait(futures)  # every worker has stopped touching its models before an error is raised
        for f in futures:
            f.result()
        return out

    def sync(self, agent_indices: Sequence[int] | None = None) -> None:
        """Nothing to do: ``generate`` runs on the live weights."""

    def close(self) -> None:
        """Nothing to release."""


def _thread_context() -> Callable[..., Any]:
    """A runner that calls ``fn(group)`` in a worker thread under the caller's autocast state (thread-local in
    torch: a worker would otherwise generate in full precision under a mixed-precision fit) with ``device`` as the
    current CUDA device."""
    autocast = [(d, torch.get_autocast_dtype(d)) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)]

    def run(fn: Callable[[list[int]], None], group: list[int], device: torch.device) -> None:
        with contextlib.ExitStack() as stack:
            if device.type == "cuda":
                stack.enter_context(torch.cuda.device(device))
            for device_type, dtype in autocast:
                stack.enter_context(torch.autocast(device_type, dtype=dtype))
            fn(group)

    return run
