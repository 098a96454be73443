"""The oracle: ``reward_func`` (+ optional ``reward_processor``) with signature dispatch and value checks.

A reward that raises, or returns NaN, inf, None or the wrong number of values is an error naming the task
item (docs/decisions.md, decision 9): an update is never silently skipped. A reward that does not return within
``reward_timeout`` seconds is one too (:class:`BoundedCall`, docs/multiturn.md §6.4).
"""

from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch


class RewardError(ValueError):
    """The reward function failed or returned an unusable value; the message names the task item."""


class UserCodeTimeout(TimeoutError):
    """A user callable (reward function, transition) did not return within its timeout option."""


def check_timeout_option(name: str, value: Any) -> float | None:
    """``value`` of a timeout option (seconds) as a float, or None (no limit); anything else is a ValueError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds or None (no limit); got {value!r}.")
    return float(value)


def _label(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module and module not in ("builtins", "__main__") else str(name)


class BoundedCall:
    """``fn`` with a deadline on every call: the call runs on a worker thread, and when it has not returned
    after ``timeout`` seconds the caller gets :class:`UserCodeTimeout` naming ``role``, the function, ``option``
    and (through ``describe(args, kwargs)``) what it was called on.

    Python cannot stop a running call from outside: the stuck call is left running on its daemon thread, which
    holds what it holds (CPU, memory, open files) until it returns or the process exits. The error stops the
    run (Lightning ends ``fit`` on it), and at exit the daemon thread does not hold the process up.

    The call sees what the caller sees (arguments, globals) and the caller's torch grad mode, but not other
    thread-local state of the calling thread; inside it, ``signal.alarm`` and other main-thread-only tools do
    not work. ``inspect.signature`` sees ``fn``'s own signature (``__wrapped__``) and every other attribute is
    ``fn``'s, so signature dispatch and attributes such as ``reward_range`` or ``register`` work as before.
    """

    def __init__(self, fn: Callable, timeout: float, option: str, role: str,
                 describe: Callable[[tuple, dict], str] | None = None) -> None:
        self.__wrapped__ = fn
        self.timeout, self.option, self.role, self.describe = timeout, option, role, describe

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn, box, done = self.__wrapped__, {}, threading.Event()
        grad = torch.is_grad_enabled()

        def run() -> None:
            try:
                with torch.set_grad_enabled(grad):
                    box["value"] = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=run, name=f"{self.option}:{_label(fn)}", daemon=True).start()
        if not done.wait(self.timeout):
            on = f" on {self.describe(args, kwargs)}" if self.describe is not None else ""
            raise UserCodeTimeout(
                f"{self.role} {_label(fn)} did not return within {self.option}={self.timeout:g} s{on}. The call is "
                f"left running on a daemon thread and the run stops here; raise {self.option} (seconds, None = no "
                "limit) if it needs longer, or find what blocks it.")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def __getattr__(self, name: str) -> Any:
        if name == "__wrapped__":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.__wrapped__, name)

    def __repr__(self) -> str:
        return f"BoundedCall({self.__wrapped__!r}, {self.option}={self.timeout:g})"


def bounded(fn: Callable, timeout: float | None, option: str, role: str,
            describe: Callable[[tuple, dict], str] | None = None) -> Callable:
    """``fn`` itself when ``timeout`` is None, else a :class:`BoundedCall` (``timeout`` checked as ``option``)."""
    timeout = check_timeout_option(option, timeout)
    if timeout is None or fn is None:
        return fn
    if isinstance(fn, BoundedCall):
        fn = fn.__wrapped__
    return BoundedCall(fn, timeout, option, role, describe)


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
    ``reward_processor(raw)`` (identity by default). With ``timeout`` (seconds; the data module's
    ``reward_timeout``), ``reward_func`` is a :class:`BoundedCall`: every caller of ``oracle.reward_func`` gets
    the deadline, and a call past it is a :class:`RewardError` naming the item and the function.
    """

    def __init__(self, reward_func: Callable, reward_processor: Callable[[float], float] | None = None,
                 timeout: float | None = None):
        if not callable(reward_func):
            raise ValueError(f"reward_func must be a callable; got {type(reward_func).__name__}.")
        if reward_processor is not None and not callable(reward_processor):
            raise ValueError(f"reward_processor must be a callable or None; got {type(reward_processor).__name__}.")
        self.timeout = check_timeout_option("reward_timeout", timeout)
        self.reward_func = bounded(reward_func, self.timeout, "reward_timeout", "reward_func")
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


class RewardShift:
    """A ``reward_processor`` that adds a constant: ``x -> x + value`` (CoMLRL's ``reward_processor: {shift: v}``).

    A class rather than a lambda so that YAML can name it (``class_path: comlrl_lightning.rewards.RewardShift``,
    ``init_args: {value: -4}``) and processes can pickle it."""

    def __init__(self, value: float) -> None:
        self.value = float(value)
        if not math.isfinite(self.value):
            raise ValueError(f"RewardShift(value={value!r}): expected a finite number.")

    def __call__(self, x: float) -> float:
        return x + self.value

    def __repr__(self) -> str:
        return f"RewardShift(value={self.value!r})"


class RewardScale:
    """A ``reward_processor`` that multiplies: ``x -> x * factor`` (CoMLRL's ``reward_processor: {scale: f}``);
    named in YAML like :class:`RewardShift` (``init_args: {factor: 0.5}``)."""

    def __init__(self, factor: float) -> None:
        self.factor = float(factor)
        if not math.isfinite(self.factor):
            raise ValueError(f"RewardScale(factor={factor!r}): expected a finite number.")

    def __call__(self, x: float) -> float:
        return x * self.factor

    def __repr__(self) -> str:
        return f"RewardScale(factor={self.factor!r})"


class RewardProcessors:
    """Small helpers for ``reward_processor`` (CoMLRL's names): ``scale(f)`` → x·f, ``shift(v)`` → x+v."""

    @staticmethod
    def scale(factor: float) -> RewardScale:
        return RewardScale(factor)

    @staticmethod
    def shift(value: float) -> RewardShift:
        return RewardShift(value)


def set_reward_range(fn: Callable, lo: float, hi: float) -> Callable:
    """Declare the raw reward scale of ``fn`` as ``fn.reward_range = (lo, hi)`` and return ``fn``."""
    fn.reward_range = (float(lo), float(hi))
    return fn
