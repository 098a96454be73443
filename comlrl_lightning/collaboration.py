"""Centralized collaboration (``collaboration_mode="centralized"``, docs/coming-from-comlrl.md): one learner
writes every role's output in one joint text.

The learner sees one prompt per task item, ``adapter.build_prompt(item, [role prompts])``, and its joint
completion is kept verbatim for learning (pairs, replay files and scoring hold the raw joint text). The task
reward parses the joint text back into one output per role with the same adapter and calls the user's reward
function on them exactly as a decentralized team's outputs. The default adapter is CoMLRL's tagged
``<agent_i>`` format (:class:`~comlrl_lightning.comparators.centralized.TaggedCentralizedComparatorAdapter`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from comlrl_lightning.comparators.centralized import CentralizedComparatorParseError
from comlrl_lightning.rewards import call_reward_function


class CentralizedPrompt:
    """The single learner's formatter: the adapter's joint prompt over every role's own prompt."""

    def __init__(self, adapter: Any, role_formatters: Sequence[Callable[[dict], str]]):
        self.adapter = adapter
        self.role_formatters = list(role_formatters)

    def __call__(self, item: dict) -> str:
        prompt = self.adapter.build_prompt(item, [f(item) for f in self.role_formatters])
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("Centralized adapter must build a non-empty prompt.")
        return prompt


class CentralizedReward:
    """The task reward of a joint text: parse it into one output per role (an unparsable text counts as empty
    outputs), then call ``reward_func`` with the roles' outputs, the first role's prompt and the item. Exposes the
    user function's ``reward_range``."""

    def __init__(self, adapter: Any, reward_func: Callable, role_formatters: Sequence[Callable[[dict], str]]):
        self.adapter = adapter
        self.reward_func = reward_func
        self.role_formatters = list(role_formatters)
        if hasattr(reward_func, "reward_range"):
            self.reward_range = reward_func.reward_range

    def split(self, text: str, item: Any) -> list[str]:
        """One output per role (R empty strings when the text has no parsable section)."""
        roles = len(self.role_formatters)
        try:
            outputs = self.adapter.parse_completion(text, item, roles)
        except CentralizedComparatorParseError:
            return [""] * roles
        if isinstance(outputs, (str, bytes)) or not isinstance(outputs, Sequence):
            raise ValueError("Centralized adapter must return a sequence of strings.")
        if len(outputs) != roles:
            raise ValueError("Centralized adapter must return exactly R outputs.")
        if not all(isinstance(o, str) for o in outputs):
            raise ValueError("Centralized adapter outputs must all be strings.")
        return list(outputs)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], batch_items: Sequence[dict] | None = None
                 ) -> list[float]:
        if batch_items is None:
            raise ValueError("Centralized task rewards require batch_items.")
        rewards = []
        for text, item in zip(completions, batch_items):
            outputs = self.split(text, item)
            values = call_reward_function(self.reward_func, [self.role_formatters[0](item)], [[o] for o in outputs],
                                          [item])
            if len(values) != 1:
                raise ValueError("Centralized task reward must return one joint reward.")
            rewards.append(values[0])
        return rewards


class CentralizedEvalLogger:
    """CoMLRL's ``eval_logger`` behind a joint learner: the evaluation's joint texts
    (``agent_completions_turns[0][item][turn]``) are split into one output per role with the reward's adapter, so
    the user's logger receives ``agent_completions_turns[role][item][turn]`` as for a decentralized team."""

    def __init__(self, reward: CentralizedReward, eval_logger: Callable):
        self.reward = reward
        self.eval_logger = eval_logger

    def __call__(self, agent_completions_turns: Sequence, batch_items: Sequence, prompts: Sequence) -> Any:
        joint = agent_completions_turns[0]
        roles = len(self.reward.role_formatters)
        per_role: list[list[list[str]]] = [[[] for _ in joint] for _ in range(roles)]
        for k, (turns, item) in enumerate(zip(joint, batch_items)):
            for text in turns:
                for r, output in enumerate(self.reward.split(text, item)):
                    per_role[r][k].append(output)
        return self.eval_logger(agent_completions_turns=per_role, batch_items=batch_items, prompts=prompts)


class SeparatorCentralizedAdapter:
    """A plain-text joint format: the roles' outputs one after the other, cut at ``separator``.

    The joint prompt lists the roles' prompts and asks for the outputs in role order separated by ``separator``;
    a completion is cut at its first R-1 separators (missing roles are empty, extra separators stay in the last
    role's output). Unlike the tagged format, any text parses, so a small model gets a reward signal from the
    first sample (the embedded tiny model: configs/magrpo/centralized_tiny.yaml).
    """

    def __init__(self, separator: str = "\n"):
        if not isinstance(separator, str) or not separator:
            raise ValueError(f"separator must be a non-empty string. Got {separator!r}.")
        self.separator = separator

    def build_prompt(self, item: Any, prompts: Sequence[str]) -> str:
        """Every role's prompt, numbered from 0, then the instruction."""
        parts = [f"Role {i}: {p}" for i, p in enumerate(prompts)]
        return "\n".join([*parts, f"Write the {len(prompts)} outputs in role order, separated by "
                           f"{self.separator!r}:\n"])

    def parse_completion(self, text: str, item: Any, num_agents: int) -> list[str]:
        """``num_agents`` outputs (see the class docstring)."""
        parts = text.split(self.separator, num_agents - 1)
        return [p.strip() for p in parts] + [""] * (num_agents - len(parts))


def resolve_adapter(adapter: Any) -> Any:
    """``centralized_adapter``: None = CoMLRL's tagged ``<agent_i>`` format; an object with ``build_prompt`` and
    ``parse_completion``; a dotted import path to such an object or to a class (instantiated without
    arguments); or, from YAML, ``{class_path: ..., init_args: {...}}``."""
    from comlrl_lightning.comparators.centralized import TaggedCentralizedComparatorAdapter
    from comlrl_lightning.data.sources import resolve_callable

    if adapter is None:
        return TaggedCentralizedComparatorAdapter()
    init_args: dict = {}
    if isinstance(adapter, dict) and "class_path" in adapter:
        adapter, init_args = adapter["class_path"], dict(adapter.get("init_args") or {})
    if isinstance(adapter, str):
        adapter = resolve_callable(adapter, "centralized_adapter")
        if isinstance(adapter, type):
            adapter = adapter(**init_args)
    for name in ("build_prompt", "parse_completion"):
        if not callable(getattr(adapter, name, None)):
            raise TypeError(f"centralized_adapter.{name} must be callable; got {type(adapter).__name__}, which has "
                            "none. Give an object with build_prompt(item, prompts) and parse_completion(text, item, "
                            "num_agents), e.g. comlrl_lightning.comparators.centralized."
                            "TaggedCentralizedComparatorAdapter.")
    return adapter
