"""LearnedRewardOracle: a fitted JointRewardModel behind the task-reward oracle interface (docs/preference.md §8.4–8.5).

MARLHF's RL stage, and MARLHFIter's comparisons with ``preference_scoring_reward="reward_model"``, score
joint responses with the reward model instead of the task reward. The scalar is used as both the
processed and the raw value; no ``reward_processor`` is applied (upstream). Scoring prompts are the
formatters' prompts of the task item (docs/preference.md §8.1: ``formatters[i](item)``), so they match the prompts the
pairs were built with for deterministic formatters (docs/preference.md §8.1).

Two call styles, one per RL backend family:

* ``score(prompts, completions, item, index) -> (r, r)`` like :class:`~comlrl_lightning.rewards.RewardOracle`
  (MAGRPO family, preference collection);
* ``reward_func(*agent_completion_lists, prompts=..., batch_items=...) -> [r_1..r_G]`` with
  ``reward_processor = None`` (the actor-critic modules call the task reward that way): one score per
  aligned joint sample j = (c_1[j], ..., c_N[j]).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from comlrl_lightning.rewards import RewardError


class LearnedRewardOracle:
    """Score joint responses with a (fitted) :class:`~comlrl_lightning.modules.reward_model.JointRewardModel`.

    Args:
        reward_model: anything with ``score(prompts_per_pair, completions_per_pair) -> list[float]``.
        formatters: one prompt function per agent; None uses the prompts given to :meth:`score`.
        batch_size: joint texts per reward-model forward.
    """

    reward_processor = None

    def __init__(self, reward_model: Any, formatters: Sequence[Callable[[dict], str]] | None = None,
                 batch_size: int = 16):
        if not callable(getattr(reward_model, "score", None)):
            raise TypeError(f"reward_model must have score(prompts_per_pair, completions_per_pair); got "
                            f"{type(reward_model).__name__}.")
        self.reward_model = reward_model
        self.formatters = list(formatters) if formatters is not None else None
        self.batch_size = batch_size
        self.reward_func = self._reward_func

    def prompts_for(self, item: dict | None, prompts: Sequence[str] | None, num_agents: int) -> list[str]:
        """Per-agent scoring prompts: the formatters applied to ``item`` (docs/preference.md §8.1), else ``prompts``."""
        if self.formatters is not None and item is not None:
            return [f(item) for f in self.formatters]
        if item is None and self.formatters is not None:
            raise ValueError("MARLHF reward model scoring requires batch_items.")
        prompts = list(prompts or [])
        return prompts + [""] * (num_agents - len(prompts)) if len(prompts) < num_agents else prompts

    def score_joint(self, prompts: Sequence[str], joint_completions: Sequence[Sequence[str]],
                    where: str = "a joint response") -> list[float]:
        """Rewards of several joint responses sharing ``prompts`` (no grad, eval mode)."""
        values = self.reward_model.score([list(prompts)] * len(joint_completions),
                                         [list(c) for c in joint_completions], batch_size=self.batch_size)
        for v in values:
            if not math.isfinite(v):
                raise RewardError(f"the reward model returned {v} on {where}; rewards must be finite numbers.")
        return [float(v) for v in values]

    def score(self, prompts: Sequence[str], completions: Sequence[str], item: dict, item_index: Any
              ) -> tuple[float, float]:
        """(reward, reward) of one joint response ``completions`` (one text per agent) for task item ``item``."""
        agent_prompts = self.prompts_for(item, prompts, len(completions))
        r = self.score_joint(agent_prompts, [list(completions)], f"task item {item_index}")[0]
        return r, r

    def _reward_func(self, *agent_completions: Sequence[str], prompts: Sequence[str] | None = None,
                     batch_items: Sequence[dict] | None = None) -> list[float]:
        """Task-reward-style call: one list of G completions per agent → G rewards (aligned joint samples)."""
        lists = [list(c) for c in agent_completions]
        if not lists:
            return []
        g = min(len(c) for c in lists)
        item = batch_items[0] if batch_items else None
        agent_prompts = self.prompts_for(item, prompts, len(lists))
        return self.score_joint(agent_prompts, [[c[j] for c in lists] for j in range(g)])
