"""Centralized comparator generation (docs/preference.md §5.4, §5.5): one writer produces every agent's output at once.

An adapter turns the agents' own prompts into one joint prompt and parses a joint completion back into
per-agent outputs. The default, :class:`TaggedCentralizedComparatorAdapter`, asks for one
``<agent_i>...</agent_i>`` section per agent (0-based) and reads them back. :class:`CentralizedComparator` is the
comparator source that writes this way (``comparator_generation_mode='centralized'``): it wraps a source of any
policy and samples one slot of it.

Parse failures are handled differently on the two paths, as upstream does:

* comparator generation (:func:`split_joint_completions`): a completion without any section raises
  :class:`CentralizedComparatorParseError` and aborts the round;
* centralized collaboration rewards (:func:`parse_for_reward`): the same failure gives empty outputs for
  every role, so the joint text is scored on empty outputs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable

from comlrl_lightning.generation import Samples

__all__ = [
    "CentralizedComparator",
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "TaggedCentralizedComparatorAdapter",
    "build_centralized_prompt",
    "parse_for_reward",
    "split_joint_completions",
]

_RAW_TEXT_CHARS = 1000  # raw completion quoted in a parse error; the full text is kept on the exception


class CentralizedComparatorParseError(ValueError):
    """A joint completion with no parsable agent section; ``text`` holds the raw completion."""

    def __init__(self, message: str, text: str = "") -> None:
        super().__init__(message)
        self.text = text

    def __reduce__(self):
        return (type(self), (self.args[0], self.text))


@runtime_checkable
class CentralizedComparatorAdapter(Protocol):
    """Builds the joint prompt and splits a joint completion into ``num_agents`` outputs."""

    def build_prompt(self, item: Any, prompts: Sequence[str]) -> str:
        """The joint prompt for one task item, given each agent's own prompt (agent order)."""
        ...

    def parse_completion(self, text: str, item: Any, num_agents: int) -> list[str]:
        """One output per agent; raises ``CentralizedComparatorParseError`` when nothing is parsable."""
        ...


@lru_cache(maxsize=256)
def _section_pattern(index: int) -> re.Pattern[str]:
    # `\s*>` after the index keeps <agent_1> from matching <agent_10>.
    return re.compile(
        rf"<\s*agent_{index}\s*>(.*?)<\s*/\s*agent_{index}\s*>", flags=re.IGNORECASE | re.DOTALL
    )


class TaggedCentralizedComparatorAdapter:
    """Default, domain-neutral adapter: one ``<agent_i>`` section per agent, numbered from 0.

    The prompt text is upstream's, byte for byte (docs/preference.md §5.4), including the trailing newline.
    """

    def build_prompt(self, item: Any, prompts: Sequence[str]) -> str:
        """Joint prompt for ``len(prompts)`` agents; ``item`` is not used."""
        if isinstance(prompts, (str, bytes)):
            raise TypeError("prompts must be a sequence of per-agent prompt strings, not a single string.")
        n = len(prompts)
        header = (
            f"You are a centralized coordinator producing the separate outputs of {n} agents.\n\n"
            "Each output must satisfy its corresponding original prompt. Keep the outputs separate;\n"
            "do not merge them or add commentary outside the required tags.\n\n"
        )
        sections = "\n\n".join(f"Agent {i} original prompt:\n{prompt}" for i, prompt in enumerate(prompts))
        skeleton = "\n".join(f"<agent_{i}>\n...\n</agent_{i}>" for i in range(n))
        return (
            f"{header}{sections}\n\nReturn exactly one section for each agent in this format:\n{skeleton}\n"
        )

    def format_completion(self, outputs: Sequence[str]) -> str:
        """A joint completion in the requested format (the inverse of :meth:`parse_completion`)."""
        return "\n".join(f"<agent_{i}>\n{text}\n</agent_{i}>" for i, text in enumerate(outputs))

    def parse_completion(self, text: str | bytes, item: Any, num_agents: int) -> list[str]:
        """The stripped content of the first ``<agent_i>...</agent_i>`` section for each agent, or "".

        Tags are case-insensitive and may hold whitespace (``< AGENT_0 >``, ``</ agent_0>``); content may
        span lines. Raises ``CentralizedComparatorParseError`` (raw text attached) if no agent has a
        section.
        """
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        if not isinstance(text, str):
            raise TypeError(f"completion text must be a string; got {type(text).__name__}.")
        if isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1:
            raise ValueError(f"num_agents must be an integer >= 1; got {num_agents!r}.")
        outputs, found = [], False
        for i in range(num_agents):
            match = _section_pattern(i).search(text)
            found = found or match is not None
            outputs.append(match.group(1).strip() if match else "")
        if not found:
            shown = text if len(text) <= _RAW_TEXT_CHARS else text[:_RAW_TEXT_CHARS] + "...[truncated]"
            raise CentralizedComparatorParseError(
                "Centralized completion did not contain any indexed agent sections. "
                f"Expected <agent_0>...</agent_0> to <agent_{num_agents - 1}>...</agent_{num_agents - 1}>; "
                f"raw completion: {shown!r}",
                text,
            )
        return outputs


def build_centralized_prompt(adapter: CentralizedComparatorAdapter, item: Any, prompts: Sequence[str]) -> str:
    """``adapter.build_prompt`` checked to be a non-empty string (docs/preference.md §5.4)."""
    prompt = adapter.build_prompt(item, list(prompts))
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("centralized_comparator_adapter.build_prompt must return a non-empty string.")
    return prompt


def _checked_outputs(outputs: Any, num_agents: int, owner: str) -> list[str]:
    if isinstance(outputs, (str, bytes)):
        raise TypeError(f"{owner}.parse_completion must return a sequence of strings, not a single string.")
    outputs = list(outputs)
    if len(outputs) != num_agents:
        raise ValueError(
            f"{owner}.parse_completion must return exactly {num_agents} outputs; got {len(outputs)}."
        )
    if not all(isinstance(o, str) for o in outputs):
        raise TypeError(f"{owner}.parse_completion outputs must all be strings.")
    return outputs


def split_joint_completions(
    adapter: CentralizedComparatorAdapter, completions: Sequence[str], item: Any, num_agents: int
) -> list[list[str]]:
    """Per-agent candidate lists ``[agent][candidate]`` from joint completions, candidate order kept.

    Parse errors propagate: one untagged comparator sample aborts the run (docs/preference.md §5.4).
    """
    if not completions:
        raise ValueError("Centralized comparator produced no candidates.")
    per_candidate = [
        _checked_outputs(
            adapter.parse_completion(text, item, num_agents), num_agents, "centralized_comparator_adapter"
        )
        for text in completions
    ]
    return [[outputs[agent] for outputs in per_candidate] for agent in range(num_agents)]


def parse_for_reward(
    adapter: CentralizedComparatorAdapter, text: str, item: Any, num_roles: int
) -> list[str]:
    """Role outputs of a centralized-collaboration joint text for the task reward (docs/preference.md §5.5).

    A ``CentralizedComparatorParseError`` gives ``num_roles`` empty strings; other adapter mistakes raise.
    """
    try:
        outputs = adapter.parse_completion(text, item, num_roles)
    except CentralizedComparatorParseError:
        return [""] * num_roles
    if isinstance(outputs, (str, bytes)):
        raise TypeError("Centralized adapter must return a sequence of strings.")
    outputs = list(outputs)
    if len(outputs) != num_roles:
        raise ValueError(f"Centralized adapter must return exactly {num_roles} outputs.")
    if not all(isinstance(o, str) for o in outputs):
        raise TypeError("Centralized adapter outputs must all be strings.")
    return outputs


class CentralizedComparator:
    """Centralized comparator generation (docs/preference.md §5.4): one slot writes every role's answer in one text.

    Slot ``agent_index`` of the ``inner`` source (any policy: live agent, copy, model, snapshot or API)
    samples joint completions of ``adapter.build_prompt(item, per-role prompts)``; each joint text is parsed
    back into role texts with ``adapter.parse_completion``, candidate order kept. A parse failure raises
    :class:`CentralizedComparatorParseError` with the raw text. The round life cycle (``setup``, ``prepare``,
    ``release``, ``close``, ``state_dict``, ``load_state_dict``) is the inner source's: each step is passed on when
    the inner source has it.
    """

    def __init__(self, inner: Any, adapter: Any = None, agent_index: int = 0):
        self.inner = inner
        self.adapter = adapter if adapter is not None else TaggedCentralizedComparatorAdapter()
        for name in ("build_prompt", "parse_completion"):
            if not callable(getattr(self.adapter, name, None)):
                raise TypeError(f"centralized_comparator_adapter.{name} must be callable.")
        if not hasattr(inner, "sample_agent"):
            raise TypeError(f"{type(inner).__name__} cannot sample a single slot (no sample_agent method).")
        self.agent_index = agent_index
        self.policy = getattr(inner, "policy", "local")

    def _inner_step(self, name: str, *args: Any) -> Any:
        """The inner source's optional life-cycle step ``name`` (the Comparator protocol), when it has one."""
        step = getattr(self.inner, name, None)
        return None if step is None else step(*args)

    def setup(self, trainer: Any, pl_module: Any) -> None:
        self._inner_step("setup", trainer, pl_module)

    def prepare(self, round_index: int) -> None:
        self._inner_step("prepare", round_index)

    def release(self) -> None:
        self._inner_step("release")

    def close(self) -> None:
        self._inner_step("close")

    def state_dict(self) -> dict | None:
        return self._inner_step("state_dict")

    def load_state_dict(self, state: dict) -> None:
        self._inner_step("load_state_dict", state)

    def sample(self, prompts: Sequence[Sequence[str]], num_candidates: int,
               items: Sequence[dict] | None = None) -> list[Samples]:
        num_agents, num_items = len(prompts), len(prompts[0])
        items = list(items) if items is not None else [{} for _ in range(num_items)]
        joint_prompts = [build_centralized_prompt(self.adapter, items[k], [prompts[a][k] for a in range(num_agents)])
                         for k in range(num_items)]
        joint = self.inner.sample_agent(self.agent_index, joint_prompts, num_candidates, items)
        per_item = [split_joint_completions(self.adapter, joint.texts[k], items[k], num_agents)
                    for k in range(num_items)]
        return [Samples(prompt_ids=[[] for _ in range(num_items)],
                        completion_ids=[[[] for _ in per_item[k][a]] for k in range(num_items)],
                        texts=[per_item[k][a] for k in range(num_items)]) for a in range(num_agents)]
