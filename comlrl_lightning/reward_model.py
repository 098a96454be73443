"""The joint reward model's components: the joint text template, last-token pooling, tokenization (docs/preference.md
§8), and :class:`LearnedRewardOracle`, a fitted model behind the task-reward oracle interface (docs/preference.md
§8.4–8.5).

The options are :mod:`comlrl_lightning.config.reward_model`, the LightningModule
:mod:`comlrl_lightning.modules.reward_model`, the pair DataModule :mod:`comlrl_lightning.data.reward_model` and the
fitting callbacks :mod:`comlrl_lightning.callbacks.reward_model`. Training and scoring build and tokenize the joint
text with the functions here, in exactly one place.

LearnedRewardOracle: MARLHF's RL stage, and
MARLHFIter's comparisons with ``preference_scoring_reward="reward_model"``, score
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

import torch
from torch import Tensor

from comlrl_lightning.rewards import RewardError

JOINT_RESPONSE_HEADER = "Joint multi-agent response"

#: Above this, ``tokenizer.model_max_length`` is transformers' "no limit" sentinel (int(1e30)).
_NO_LIMIT = 10**9


def joint_reward_text(prompts: Sequence[str | None], completions: Sequence[str | None]) -> str:
    """The text the reward model reads for one joint response (docs/preference.md §8.1).

    Parts joined by a blank line (``"\\n\\n"``): ``"Joint multi-agent response"``, then per agent i
    (1-based) ``"Agent i prompt:\\n{p_i}"`` and ``"Agent i response:\\n{c_i}"``. The number of agents is
    ``max(len(prompts), len(completions))``; a missing (or None) prompt or completion becomes ``""``.

    Example: prompts (pa, pb) and completions (ca, cb) give
    ``"Joint multi-agent response\\n\\nAgent 1 prompt:\\npa\\n\\nAgent 1 response:\\nca\\n\\n"``
    ``"Agent 2 prompt:\\npb\\n\\nAgent 2 response:\\ncb"``.
    """
    n = max(len(prompts), len(completions))
    parts = [JOINT_RESPONSE_HEADER]
    for i in range(n):
        p = prompts[i] if i < len(prompts) and prompts[i] is not None else ""
        c = completions[i] if i < len(completions) and completions[i] is not None else ""
        parts.append(f"Agent {i + 1} prompt:\n{p}")
        parts.append(f"Agent {i + 1} response:\n{c}")
    return "\n\n".join(parts)


def num_length_features(num_agents: int) -> int:
    """How many numbers :func:`response_length_features` returns: ``3N + N(N-1)/2``."""
    return 3 * num_agents + num_agents * (num_agents - 1) // 2


def response_length_features(completions: Sequence[str | None], num_agents: int) -> list[float]:
    """Length features of one joint response, read by a length-aware head (docs/preference.md §8.2).

    With ``L_i`` the characters of agent i's stripped response (a missing or None completion is ``""``) and
    ``x_i = log(1 + L_i)``: per agent ``[x_i, x_i², 1 if L_i == 0 else 0]`` (agent by agent), then
    ``x_i · x_j`` for every pair i < j. A linear head on them is a quadratic function of the log lengths, so
    it can prefer a range of lengths and of length ratios (``log L_j − log L_i``), not only "longer"; the
    empty flag tells "stopped at once" apart from "short". ``num_length_features(num_agents)`` numbers.
    """
    xs, out = [], []
    for i in range(num_agents):
        c = completions[i] if i < len(completions) and completions[i] is not None else ""
        n = len(c.strip())
        x = math.log1p(n)
        xs.append(x)
        out += [x, x * x, 1.0 if n == 0 else 0.0]
    out += [xs[i] * xs[j] for i in range(num_agents) for j in range(i + 1, num_agents)]
    return out


def last_token_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Hidden state at each row's last non-padding token (docs/preference.md §8.2).

    Rule: for row b, the position is the **largest index t with attention_mask[b, t] == 1**. This is
    right for left padding (the last column), right padding (before the pads) and no padding alike;
    the older ``sum(mask) - 1`` rule is only right for right padding.

    Args:
        hidden: ``[B, T, H]`` last-layer hidden states.
        attention_mask: ``[B, T]`` 0/1 (or bool); every row needs at least one 1.

    Returns:
        ``[B, H]`` pooled hidden states (differentiable w.r.t. ``hidden``).
    """
    if hidden.ndim != 3 or attention_mask.ndim != 2 or hidden.shape[:2] != attention_mask.shape:
        raise ValueError(
            "last_token_pool expects hidden [B, T, H] and attention_mask [B, T] with matching B and T; got "
            f"{tuple(hidden.shape)} and {tuple(attention_mask.shape)}."
        )
    mask = attention_mask.to(device=hidden.device) != 0
    empty = ~mask.any(dim=1)
    if empty.any():
        raise ValueError(
            f"last_token_pool: row(s) {empty.nonzero().flatten().tolist()} have no non-padding token "
            "(attention_mask is all 0)."
        )
    positions = torch.arange(mask.shape[1], device=hidden.device).expand_as(mask)
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=1).values  # [B]
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def infer_hidden_size(config: Any) -> int:
    """Backbone width from ``config.hidden_size``, then ``n_embd``, then ``d_model`` (docs/preference.md §8.2)."""
    for name in ("hidden_size", "n_embd", "d_model"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(
        "Could not infer reward model hidden size. The backbone config has none of hidden_size, n_embd, "
        f"d_model (config: {type(config).__name__})."
    )


def resolve_max_length(tokenizer: Any, max_length: int | None, fallback: int | None = None) -> int | None:
    """Truncation length: ``reward_max_length``, else ``tokenizer.model_max_length`` (docs/preference.md §2.2).

    A tokenizer without a real limit reports transformers' huge sentinel; then ``fallback`` (the
    backbone's ``max_position_embeddings``) is used, and None (no truncation) when that is unknown too.
    """
    if max_length is not None:
        return int(max_length)
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < _NO_LIMIT:
        return limit
    return fallback


def encode_joint_texts(tokenizer: Any, texts: Sequence[str], max_length: int | None) -> dict[str, Tensor]:
    """Tokenize joint texts as one padded batch (docs/preference.md §8.1).

    ``padding=True``, truncation at ``max_length`` (none when None), the tokenizer's own padding and
    truncation sides. Returns ``input_ids`` and ``attention_mask``, both ``[len(texts), T]``.
    """
    enc = tokenizer(list(texts), padding=True, truncation=max_length is not None, max_length=max_length,
                    return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def prompt_part_length(tokenizer: Any, prompts: Sequence[str | None], num_agents: int | None = None) -> int:
    """Tokens of the joint text's prompt part: the template with every response empty.

    This is ``len(tokenizer(joint_reward_text(prompts, [""] * N)).input_ids)`` with the tokenizer's
    special tokens, i.e. the header, every agent's prompt and every "Agent i response:" label.
    """
    n = max(len(prompts), num_agents or 0)
    return len(tokenizer(joint_reward_text(prompts, [""] * n))["input_ids"])


def check_prompt_part_fits(
    tokenizer: Any, prompts: Sequence[str | None], num_agents: int, max_length: int | None, what: str
) -> None:
    """Raise when ``max_length`` leaves no room for the responses (see :func:`prompt_part_length`).

    Detection rule: error when ``prompt_part_length(...) >= max_length``. Truncating the joint text to
    that many tokens then cuts every token of at least one agent's response (the last one's with right
    truncation, the first one's with left truncation), so winner and loser could no longer be told
    apart. ``what`` names the offending pair or sample in the message.
    """
    if max_length is None:
        return
    need = prompt_part_length(tokenizer, prompts, num_agents)
    if need >= max_length:
        raise ValueError(
            f"reward_max_length={max_length} is too short for {what}: its prompt part (the joint text with "
            f"every response empty) already takes {need} tokens, so the responses would be truncated away. "
            f"Set reward_max_length to more than {need} plus the response length, or shorten the prompts."
        )


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
