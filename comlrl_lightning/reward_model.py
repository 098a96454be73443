"""Joint reward model helpers: the joint text template, last-token pooling, tokenization, options.

docs/preference.md §8. The LightningModule lives in :mod:`comlrl_lightning.modules.reward_model` and the
pair DataModule in :mod:`comlrl_lightning.data.reward_pairs`; both use the functions here, so the text the
model is trained on and the text it scores are built and tokenized in exactly one place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from comlrl_lightning.config import register_yaml_representers
from comlrl_lightning.config.checks import _bad

JOINT_RESPONSE_HEADER = "Joint multi-agent response"

#: Values of ``reward_length_features``.
LENGTH_FEATURE_MODES = ("off", "add", "only")

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


@dataclass
class RewardModelOptions:
    """Reward-model options of ``MARLHFConfig`` (docs/preference.md §2.2), usable on their own."""

    reward_model_name: str | None = None
    """Hub id, local folder or ``embedded:tiny`` of the reward backbone (MARLHF falls back to the agents')."""
    reward_learning_rate: float = 1e-5
    """AdamW learning rate of the reward model."""
    reward_num_train_epochs: int = 1
    """Epochs over the pairs (each MARLHFIter round trains a fresh model for this many epochs)."""
    reward_train_batch_size: int = 1
    """Pairs per optimizer step."""
    reward_max_length: int | None = None
    """Tokenizer truncation length; None uses the tokenizer's ``model_max_length``."""
    reward_freeze_backbone: bool = False
    """Train only the scalar head (the backbone gets requires_grad=False)."""
    reward_length_features: str = "off"
    """Length-aware head (see :func:`response_length_features`): "off" (upstream), "add" (a linear head on
    each agent's response length is added to the backbone's score) or "only" (the reward is that length head
    alone, the backbone is not run: a length-only reward model). For preferences that depend on response
    lengths, which a small backbone cannot count from its last token."""

    def __post_init__(self) -> None:
        if self.reward_model_name is not None and not isinstance(self.reward_model_name, str):
            raise _bad("reward_model_name must be a string (hub id, local folder, 'embedded:tiny') or null.",
                       self.reward_model_name,
                       "strings or null; pass model objects to JointRewardModel(model=...)")
        lr = self.reward_learning_rate
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (lr > 0 and math.isfinite(lr)):
            raise _bad("reward_learning_rate must be > 0.", lr, "finite numbers > 0")
        for name in ("reward_num_train_epochs", "reward_train_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise _bad(f"{name} must be >= 1.", value, "integers >= 1")
        m = self.reward_max_length
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise _bad("reward_max_length must be >= 1 or null.", m, "integers >= 1 or null")
        if not isinstance(self.reward_freeze_backbone, bool):
            raise _bad("reward_freeze_backbone must be a bool.", self.reward_freeze_backbone, "true, false")
        if self.reward_length_features not in LENGTH_FEATURE_MODES:
            raise _bad("reward_length_features must be one of off, add, only.", self.reward_length_features,
                       ", ".join(LENGTH_FEATURE_MODES))

    @property
    def num_train_epochs(self) -> int:
        """Alias of ``reward_num_train_epochs``: the CLI derives ``trainer.max_epochs`` from it."""
        return self.reward_num_train_epochs

    def to_dict(self) -> dict[str, Any]:
        """Plain-type dict of every option."""
        return asdict(self)


register_yaml_representers(RewardModelOptions)  # hparams.yaml stays yaml.safe_load-able
