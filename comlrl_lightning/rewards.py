"""The oracle: ``reward_func`` (+ optional ``reward_processor``) with signature dispatch and value checks.

A reward that raises, or returns NaN, inf, None or the wrong number of values is an error naming the task
item (docs/decisions.md, decision 9): an update is never silently skipped.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch


class RewardError(ValueError):
    """The reward function failed or returned an unusable value; the message names the task item."""


def _signature_plan(fn: Callable) -> tuple[bool, int, bool, bool, bool] | None:
    """(has *args, positional count, accepts batch_items, accepts prompts kw, has **kwargs) or None."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    has_var = any(p.kind is p.VAR_POSITIONAL for p in params)
    has_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = {p.name for p in params}
    return has_var, len(positional), "batch_items" in names or has_kw, "prompts" in names or has_kw, has_kw


def call_reward_function(
    fn: Callable,
    prompts: Sequence[str],
    agent_completions: Sequence[Sequence[str]],
    batch_items: Sequence[dict] | None = None,
) -> list[float]:
    """Call a user reward function the way CoMLRL does (docs/multiturn.md §6.1) and coerce the result.

    Dispatch on the number P of positional parameters, for N agents with completion lists c_1..c_N:
    ``*args`` → f(c_1..c_N); N == 1: P == 1 → f(c_1), else f(prompts, c_1); N > 1: P == N → f(c_1..c_N),
    P == N+1 → f(prompts, c_1..c_N), P == 1 → f([c_1..c_N]), else f(c_1..c_N). ``batch_items=`` and
    ``prompts=`` go as keywords when accepted. On TypeError, f(c_1..c_N) is tried once more.
    Returns a list of floats (a tensor, list/tuple or scalar is accepted).
    """
    lists = [list(c) for c in agent_completions]
    n = len(lists)
    plan = _signature_plan(fn)
    if plan is None:
        attempts: list[tuple[tuple, dict]] = [
            ((*lists,), {"batch_items": batch_items}), ((*lists,), {}), ((lists,), {})]
    else:
        has_var, p, takes_items, takes_prompts, _ = plan
        prompts_positional = False
        if has_var:
            args: tuple = (*lists,)
        elif n == 1:
            if p == 1:
                args = (lists[0],)
            else:
                args, prompts_positional = (list(prompts), lists[0]), True
        elif p == n:
            args = (*lists,)
        elif p == n + 1:
            args, prompts_positional = (list(prompts), *lists), True
        elif p == 1:
            args = (lists,)
        else:
            args = (*lists,)
        kwargs: dict[str, Any] = {}
        if takes_items and batch_items is not None:
            kwargs["batch_items"] = list(batch_items)
        if takes_prompts and not prompts_positional:
            kwargs["prompts"] = list(prompts)
        attempts = [(args, kwargs), ((*lists,), {})]
    first_error: TypeError | None = None
    for args, kwargs in attempts:
        try:
            value = fn(*args, **kwargs)
        except TypeError as exc:
            if first_error is None:
                first_error = exc
            continue
        return _coerce(value)  # a bad return value is not a signature problem: no retry
    assert first_error is not None
    raise first_error


def _coerce(value: Any) -> list[float]:
    if isinstance(value, torch.Tensor):
        value = value.detach().flatten().tolist()
    elif isinstance(value, (list, tuple)):
        value = list(value)
    else:
        value = [value]
    out = []
    for v in value:
        if v is None:
            raise ValueError("reward value is None")
        if isinstance(v, torch.Tensor):
            v = v.item()
        out.append(float(v))
    return out


class RewardOracle:
    """Score joint responses with the task reward.

    ``score`` calls ``reward_func`` once per joint response (one single-element completion list per agent,
    as upstream does), checks the value, and returns ``(processed, raw)`` where processed =
    ``reward_processor(raw)`` (identity by default).
    """

    def __init__(self, reward_func: Callable, reward_processor: Callable[[float], float] | None = None):
        if not callable(reward_func):
            raise ValueError(f"reward_func must be a callable; got {type(reward_func).__name__}.")
        if reward_processor is not None and not callable(reward_processor):
            raise ValueError(f"reward_processor must be a callable or None; got {type(reward_processor).__name__}.")
        self.reward_func = reward_func
        self.reward_processor = reward_processor

    def score(self, prompts: Sequence[str], completions: Sequence[str], item: dict,
              item_index: Any) -> tuple[float, float]:
        """Reward of one joint response ``completions`` (one text per agent) for task item ``item``."""
        where = f"task item {item_index}"
        try:
            values = call_reward_function(self.reward_func, [prompts[0]], [[c] for c in completions], [item])
        except Exception as exc:  # noqa: BLE001 - re-raised with the item named
            raise RewardError(f"reward_func failed on {where}: {type(exc).__name__}: {exc}") from exc
        if len(values) != 1:
            raise RewardError(
                f"reward_func returned {len(values)} values for one joint response on {where}; expected 1."
            )
        raw = values[0]
        processed = raw
        if self.reward_processor is not None:
            try:
                processed = float(self.reward_processor(raw))
            except Exception as exc:  # noqa: BLE001
                raise RewardError(f"reward_processor failed on {where} (raw reward {raw!r}): {exc}") from exc
        for name, v in (("reward", raw), ("processed reward", processed)):
            if not math.isfinite(v):
                raise RewardError(f"{name} is {v} on {where}; rewards must be finite numbers.")
        return processed, raw


class RewardProcessors:
    """Small helpers for ``reward_processor``: ``scale(f)`` → x·f, ``shift(v)`` → x+v."""

    @staticmethod
    def scale(factor: float) -> Callable[[float], float]:
        return lambda x: x * factor

    @staticmethod
    def shift(value: float) -> Callable[[float], float]:
        return lambda x: x + value


def set_reward_range(fn: Callable, lo: float, hi: float) -> Callable:
    """Declare the raw reward scale of ``fn`` as ``fn.reward_range = (lo, hi)`` and return ``fn``."""
    fn.reward_range = (float(lo), float(hi))
    return fn
