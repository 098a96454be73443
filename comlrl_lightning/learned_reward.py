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


def support_clip_bound(scores: Sequence[float], quantile: float) -> float:
    """Upper clip bound of a learned reward: the ``quantile`` of the scores it gave its own training data.

    With ``s_(1) <= ... <= s_(n)`` the sorted scores and ``h = quantile · (n − 1)``, the bound is
    ``s_(⌊h⌋+1) + (h − ⌊h⌋) · (s_(⌊h⌋+2) − s_(⌊h⌋+1))`` (linear interpolation between order statistics, numpy's
    default quantile); ``quantile = 1`` gives the largest score. The RL reward is then ``min(r(x), bound)``:
    past the responses the reward model was fitted on it extrapolates, and clipping there leaves the policy no
    gain for moving further out (docs/preference.md §8.5).
    """
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile must be in (0, 1]; got {quantile!r}.")
    values = sorted(float(v) for v in scores)
    if not values:
        raise ValueError("support_clip_bound needs at least one score.")
    h = quantile * (len(values) - 1)
    lo = math.floor(h)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (h - lo) * (values[hi] - values[lo])


class LearnedRewardOracle:
    """Score joint responses with a (fitted) :class:`~comlrl_lightning.modules.reward_model.JointRewardModel`.

    Args:
        reward_model: anything with ``score(prompts_per_pair, completions_per_pair) -> list[float]``.
        formatters: one prompt function per agent; None uses the prompts given to :meth:`score`.
        batch_size: joint texts per reward-model forward.
        clip_max: upper bound of the returned scores (``reward_clip_quantile``, see :func:`support_clip_bound`);
            None returns the model's scores unchanged (upstream).
    """

    reward_processor = None

    def __init__(self, reward_model: Any, formatters: Sequence[Callable[[dict], str]] | None = None,
                 batch_size: int = 16, clip_max: float | None = None):
        if not callable(getattr(reward_model, "score", None)):
            raise TypeError(f"reward_model must have score(prompts_per_pair, completions_per_pair); got "
                            f"{type(reward_model).__name__}.")
        self.reward_model = reward_model
        self.formatters = list(formatters) if formatters is not None else None
        self.batch_size = batch_size
        self.clip_max = None if clip_max is None else float(clip_max)
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
        if self.clip_max is not None:
            return [min(float(v), self.clip_max) for v in values]
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
