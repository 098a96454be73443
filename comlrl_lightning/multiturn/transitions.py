"""External transitions: the user's callable that turns one turn's completions into next-turn prompts.

A transition is a plain callable with upstream's signature (docs/multiturn.md §5)::

    transition(prompt, agent_completions, num_agents,
               prompt_history_per_agent=..., response_history_per_agent=...) -> list of N prompt strings

``prompt`` is the item's raw ``prompt`` field; ``agent_completions`` the N completions of the turn just
generated on this branch; the histories hold, per agent, every prompt used / completion produced along the
branch up to and including that turn. Nothing else is ever passed: bind extra options with a closure or
``functools.partial``. The two histories are optional: a callable that does not declare them (and has no
``**kwargs``) is called without them; one whose signature cannot take the three required arguments is refused by
:func:`check_transition_signature` (the facades call it at construction).

:func:`call_transition` calls it the way upstream does (keywords) and validates the result;
:func:`next_prompts` turns the returned strings into the prompts the agents see (docs/multiturn.md §7.3);
:func:`plain_transition` is a ready-made transition (history + a revise instruction).
:func:`bound_transition` gives a transition a deadline per call (the data module's ``transition_timeout``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

TRANSITION_ARGS = ("prompt", "agent_completions", "num_agents", "prompt_history_per_agent",
                   "response_history_per_agent")


class TransitionError(ValueError):
    """The external transition failed or returned something other than N prompt strings."""


def _call_plan(fn: Callable) -> tuple[bool, tuple[str, ...]]:
    """How to call ``fn``: (the three required arguments by keyword?, the optional history names it takes).

    The required three go by keyword when ``fn`` names them (or takes ``**kwargs`` and no other positional
    parameter), else positionally; each history goes by keyword when ``fn`` declares it or takes ``**kwargs``."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins and some C callables: call as upstream does
        return True, TRANSITION_ARGS[3:]
    kinds = {p.kind for p in params.values()}
    var_kw = inspect.Parameter.VAR_KEYWORD in kinds

    def by_name(name: str) -> bool:
        p = params.get(name)
        return p is not None and p.kind not in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL, p.VAR_KEYWORD)

    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required_by_name = all(by_name(n) for n in TRANSITION_ARGS[:3]) or (var_kw and not positional)
    optional = tuple(n for n in TRANSITION_ARGS[3:] if by_name(n) or var_kw)
    return required_by_name, optional


def _invoke(fn: Callable, plan: tuple[bool, tuple[str, ...]], args: Sequence[Any]) -> Any:
    by_name, optional = plan
    values = dict(zip(TRANSITION_ARGS, args))
    extra = {n: values[n] for n in optional}
    if by_name:
        return fn(**{n: values[n] for n in TRANSITION_ARGS[:3]}, **extra)
    return fn(*args[:3], **extra)


def check_transition_signature(fn: Any, name: str = "external_transition") -> None:
    """Refuse, with a message that says what to write, a transition whose signature cannot be called with the
    three required arguments (``prompt``, ``agent_completions``, ``num_agents``) plus the histories it declares."""
    if fn is None:
        return
    if not callable(fn):
        raise ValueError(f"{name} must be a callable; got {type(fn).__name__}.")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    by_name, optional = _call_plan(fn)
    extra = dict.fromkeys(optional)
    try:
        if by_name:
            sig.bind(**dict.fromkeys(TRANSITION_ARGS[:3]), **extra)
        else:
            sig.bind(None, None, None, **extra)
    except TypeError as exc:
        label = getattr(fn, "__qualname__", None) or type(fn).__name__
        raise ValueError(
            f"{name} {label}{sig} cannot be called as a transition ({exc}). It is called with prompt, "
            "agent_completions, num_agents (by keyword, or positionally when it names them otherwise), plus "
            "prompt_history_per_agent and response_history_per_agent when it declares them or takes **kwargs; "
            "bind any other parameter with functools.partial or a closure.") from None


def _describe_call(args: tuple, kwargs: dict) -> str:
    prompt = kwargs.get("prompt", args[0] if args else "")
    text = " ".join(str(prompt).split())
    return f"the item with prompt {text[:80] + ('...' if len(text) > 80 else '')!r}"


def bound_transition(transition: Callable | None, timeout: float | None) -> Callable | None:
    """``transition`` with a deadline of ``timeout`` seconds per call (None: ``transition`` itself).

    A call past it raises :class:`~comlrl_lightning.rewards.UserCodeTimeout` naming the transition and the item's
    prompt, which :func:`call_transition` reports as a :class:`TransitionError` with the turn and branch. The stuck
    call is left running on a daemon thread and the run stops (see :class:`~comlrl_lightning.rewards.BoundedCall`);
    signature dispatch and attributes (``register``, ``bind``) are the transition's own.
    """
    from comlrl_lightning.rewards import bounded

    return bounded(transition, timeout, "transition_timeout", "external_transition", _describe_call)


def call_transition(
    transition: Callable[..., Sequence[str]],
    prompt: str,
    agent_completions: Sequence[str],
    num_agents: int,
    prompt_history_per_agent: Sequence[Sequence[str]],
    response_history_per_agent: Sequence[Sequence[str]],
    *,
    turn: int,
    branch: Any,
) -> list[str]:
    """Call ``transition`` with exactly the five arguments of the spec and check its result.

    Like upstream, every argument goes by keyword; a callable whose first three parameters have other names
    gets ``prompt, agent_completions, num_agents`` positionally instead, and the two histories go only to a
    callable that declares them or takes ``**kwargs`` (:func:`_call_plan`). ``turn`` (the 0-based turn just
    generated) and ``branch`` (e.g. the joint-action path) only name the call in errors.

    Returns:
        The N next-turn prompt strings (a new list).

    Raises:
        TransitionError: the callable raised, or did not return a list/tuple of exactly N strings.
    """
    where = f"at turn {turn + 1} (0-based turn {turn}), branch {branch}"
    completions = list(agent_completions)
    p_hist = [list(h) for h in prompt_history_per_agent]
    r_hist = [list(h) for h in response_history_per_agent]
    try:
        result = _invoke(transition, _call_plan(transition), (prompt, completions, num_agents, p_hist, r_hist))
    except TransitionError:
        raise
    except Exception as exc:
        raise TransitionError(f"External transition failed {where}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(result, (list, tuple)):
        raise TransitionError(
            f"External transition must return per-agent prompts: a list or tuple of {num_agents} strings; "
            f"got {type(result).__name__} {where}."
        )
    if len(result) != num_agents:
        raise TransitionError(
            f"External transition must return per-agent prompts: it returned {len(result)} values but "
            f"expected {num_agents} (num_agents) {where}."
        )
    for a, text in enumerate(result):
        if not isinstance(text, str):
            raise TransitionError(
                f"External transition must return per-agent prompts as strings: element {a} is "
                f"{type(text).__name__} ({text!r}) {where}."
            )
    return list(result)


def plain_transition(
    prompt: str,
    agent_completions: Sequence[str],
    num_agents: int,
    prompt_history_per_agent: Sequence[Sequence[str]] | None = None,
    response_history_per_agent: Sequence[Sequence[str]] | None = None,
) -> list[str]:
    """A ready-made transition: the task, each agent's own earlier responses, the team's last responses,
    and an instruction to revise (the "plain" mode of the code environment, for any text task).

    The result for agent a is the original (unformatted) ``prompt`` plus a history block, so with
    formatters on (the default) it goes through agent a's formatter as the item's new ``prompt``.
    """
    responses = response_history_per_agent or [[c] for c in agent_completions]
    out = []
    for a in range(num_agents):
        own = list(responses[a]) if a < len(responses) else []
        lines = [prompt, "", "Your previous responses:"]
        lines += [f"Turn {t + 1}: {r.strip()}" for t, r in enumerate(own)]
        others = [f"Agent {b + 1}: {c.strip()}" for b, c in enumerate(agent_completions) if b != a]
        if others:
            lines += ["", "Your teammates' latest responses:", *others]
        lines += ["", "Revise your response."]
        out.append("\n".join(lines))
    return out


def next_prompts(
    external: Sequence[str],
    item: dict,
    formatters: Sequence[Callable[..., str]],
    passthrough: bool,
    prompt_field: str = "prompt",
) -> list[str]:
    """The prompts the agents see at a later turn, from the transition's per-agent strings (docs/multiturn.md §7.3).

    With ``passthrough`` the string is the prompt. Otherwise agent a's formatter is applied to a shallow
    copy of ``item`` whose ``prompt_field`` is the string (and, if the formatter declares an
    ``external_prompts`` parameter, it also receives the string as ``external_prompts=``). The item itself is
    never modified.
    """
    if passthrough:
        return list(external)
    out = []
    for a, (text, fmt) in enumerate(zip(external, formatters)):
        copy = dict(item)
        copy[prompt_field] = text
        try:
            formatted = fmt(copy, external_prompts=text) if _declares(fmt, "external_prompts") else fmt(copy)
        except Exception as exc:
            raise ValueError(
                f"Formatter of agent {a} failed on a transition prompt: {type(exc).__name__}: {exc}. "
                "Set external_prompt_passthrough=True to use the transition's prompts as they are."
            ) from exc
        if not isinstance(formatted, str) or not formatted:
            raise ValueError(f"Formatter of agent {a} returned {formatted!r} for a transition prompt; prompts "
                             "must be non-empty strings.")
        out.append(formatted)
    return out


def _declares(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params
