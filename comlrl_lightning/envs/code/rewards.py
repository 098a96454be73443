"""Reward of the aux/main code task (docs/multiturn.md §5.1 "Reward", upstream ``code_rewards.py``).

Per joint completion (aux from agent 0, entry point from agent 1), at most 4.0:

=============================================  =======  ================================
term                                           value    condition
=============================================  =======  ================================
aux defined with a return                      +0.4     scoring continues either way
main (entry point) defined with a return       +0.6     otherwise stop here
combined code parses                           +0.5     otherwise stop here
tests passed                                   +p/t     t = number of test cases; stop if t=0
main calls aux                                 +0.5     only if p > 0 and aux was found
main is not a thin wrapper of aux              +1.0     only if main calls aux (as above)
aux called but its result ignored              -0.5     only if main calls aux (as above)
=============================================  =======  ================================

The gating of the last three terms (at least one passing test, aux found, main calls aux) is the
upstream behaviour; the spec's short list leaves it implicit. Each test case runs in the sandbox
with a ``timeout_s`` (10 s) alarm; after ``max_timeouts`` (3) timeouts the remaining cases count
as failed.

``reward_func(completions_agent0, completions_agent1, *, batch_items)`` fits the dispatch rules of
docs/multiturn.md §6.1 (two positional parameters for N = 2, ``batch_items`` by keyword). ``batch_items`` holds
one task dict per completion (``prompt``, ``test``, ``entry_point``), or a single item for all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from comlrl_lightning.envs.code.analysis import CodeAnalysis, analyze
from comlrl_lightning.envs.code.sandbox import (
    TestResult,
    extract_test_cases,
    require_sandbox,
    run_cases,
    test_setup_code,
)

AUX_DEFINED = 0.4
MAIN_DEFINED = 0.6
SYNTAX_OK = 0.5
TESTS = 1.0
USES_AUX = 0.5
NOT_WRAPPER = 1.0
IGNORED_AUX = -0.5
MAX_REWARD = AUX_DEFINED + MAIN_DEFINED + SYNTAX_OK + TESTS + USES_AUX + NOT_WRAPPER


@dataclass
class RewardBreakdown:
    """The terms of one reward; ``total`` is their sum."""

    aux_defined: float = 0.0
    main_defined: float = 0.0
    syntax: float = 0.0
    tests: float = 0.0
    uses_aux: float = 0.0
    not_wrapper: float = 0.0
    ignored_aux: float = 0.0
    passed: int = 0
    total_tests: int = 0

    @property
    def total(self) -> float:
        return (
            self.aux_defined
            + self.main_defined
            + self.syntax
            + self.tests
            + self.uses_aux
            + self.not_wrapper
            + self.ignored_aux
        )


def needs_tests(analysis: CodeAnalysis) -> bool:
    """Whether scoring reaches the test stage (main defined and the combined code parses)."""
    return analysis.main_ok and analysis.syntax_ok


def score(analysis: CodeAnalysis, results: Sequence[TestResult] | None) -> RewardBreakdown:
    """The reward terms from a static analysis and the test results (pure; no execution)."""
    out = RewardBreakdown()
    if analysis.aux_ok:
        out.aux_defined = AUX_DEFINED
    if not analysis.main_ok:
        return out
    out.main_defined = MAIN_DEFINED
    if not analysis.syntax_ok:
        return out
    out.syntax = SYNTAX_OK
    results = list(results or [])
    if not results:
        return out
    out.passed, out.total_tests = sum(r.passed for r in results), len(results)
    out.tests = TESTS * out.passed / out.total_tests
    if out.passed > 0 and analysis.aux_src and analysis.calls_aux:
        out.uses_aux = USES_AUX
        if not analysis.thin_wrapper:
            out.not_wrapper = NOT_WRAPPER
        if analysis.ignored_aux_calls:
            out.ignored_aux = IGNORED_AUX
    return out


def _item_field(item: Mapping, key: str, index: int) -> str:
    value = item.get(key) if isinstance(item, Mapping) else None
    if not isinstance(value, str) or (key != "prompt" and not value.strip()):
        raise ValueError(
            f"batch_items[{index}] (task {item.get('task_id', '?') if isinstance(item, Mapping) else '?'}) "
            f"needs a string field {key!r} for the code reward"
        )
    return value


def code_rewards(
    aux_completions: Sequence[str],
    main_completions: Sequence[str],
    items: Sequence[Mapping],
    *,
    timeout_s: float = 10.0,
    max_timeouts: int = 3,
    max_workers: int | None = None,
    **sandbox_options,
) -> list[RewardBreakdown]:
    """Breakdowns for aligned lists of completions and task items (sandboxes run in parallel)."""
    if len(aux_completions) != len(main_completions):
        raise ValueError(
            f"got {len(aux_completions)} aux completions but {len(main_completions)} main completions"
        )
    n = len(aux_completions)
    if len(items) == 1 and n > 1:
        items = list(items) * n
    if len(items) != n:
        raise ValueError(
            f"batch_items has {len(items)} items for {n} completions; pass one per completion or one"
        )
    analyses, jobs = [], []
    for i, (aux, main, item) in enumerate(zip(aux_completions, main_completions, items, strict=True)):
        entry, test = _item_field(item, "entry_point", i), _item_field(item, "test", i)
        prompt = _item_field(item, "prompt", i)
        analysis = analyze(aux or "", main or "", entry, prompt)
        analyses.append(analysis)
        cases = extract_test_cases(test, entry) if needs_tests(analysis) else []
        jobs.append((analysis.combined, cases, test_setup_code(test), entry, prompt) if cases else None)

    def run(job):
        if job is None:
            return []
        code, cases, setup, entry, prompt = job
        # The tests see the team's entry point only, and the prompt's own helpers: whatever else the two
        # completions define or import (an ``abs``, an aliased import, a default argument that rebinds a name)
        # stays in the sandbox's worker, out of the tests' reach.
        return run_cases(
            code, cases, setup=setup, entry_point=entry, prompt=prompt, timeout_s=timeout_s,
            max_timeouts=max_timeouts, **sandbox_options,
        )

    workers = max_workers or min(8, os.cpu_count() or 1)
    if workers <= 1 or sum(j is not None for j in jobs) <= 1:
        results = [run(job) for job in jobs]
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="code-reward") as pool:
            results = list(pool.map(run, jobs))
    return [score(a, r) for a, r in zip(analyses, results, strict=True)]


def make_code_reward_func(
    *, timeout_s: float = 10.0, max_timeouts: int = 3, max_workers: int | None = None, **sandbox_options
):
    """A reward function for the aux/main code task with the given sandbox settings; raises
    :class:`~comlrl_lightning.envs.code.sandbox.SandboxError` here when the sandbox cannot run on this machine."""
    require_sandbox(sandbox_options.get("isolation", "bwrap"), what="the code reward")
    return _reward_func(timeout_s, max_timeouts, max_workers, sandbox_options)


def _reward_func(timeout_s: float, max_timeouts: int, max_workers: int | None, sandbox_options: dict):
    def reward_func(
        completions_agent0: list[str], completions_agent1: list[str], *, batch_items=None
    ) -> list[float]:
        if batch_items is None:
            raise ValueError("the code reward needs batch_items (task dicts with prompt, test, entry_point)")
        breakdowns = code_rewards(
            completions_agent0,
            completions_agent1,
            list(batch_items),
            timeout_s=timeout_s,
            max_timeouts=max_timeouts,
            max_workers=max_workers,
            **sandbox_options,
        )
        return [b.total for b in breakdowns]

    reward_func.reward_range = (0.0, MAX_REWARD)
    return reward_func


code_reward_func = _reward_func(10.0, 3, None, {})  # built at import: the sandbox is checked when it runs
"""The default reward: 10 s per test case, at most 3 timeouts."""
