"""Options of the joint reward model (docs/preference.md §2.2, §8), declared once.

:class:`RewardModelFields` is the option group: ``MARLHFConfig`` composes it (and adds where the model runs and how
its reward is clipped), and :class:`RewardModelOptions` is the group on its own, validated when built, the ``args``
of :class:`~comlrl_lightning.modules.reward_model.JointRewardModel`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from comlrl_lightning.config.checks import bad_option
from comlrl_lightning.config.representers import register_yaml_representers

#: Values of ``reward_length_features``.
LENGTH_FEATURE_MODES = ("off", "add", "only")


@dataclass
class RewardModelFields:
    """The learned reward model's options."""

    reward_model_name: str | None = None
    """Hub id, local folder or ``embedded:tiny`` of the reward backbone; None = the agents' model name (MARLHF)."""
    reward_learning_rate: float = 1e-5
    """AdamW learning rate of the reward model."""
    reward_num_train_epochs: int = 1
    """Epochs over the pairs (each MARLHFIter round trains a fresh model for this many epochs)."""
    reward_train_batch_size: int = 1
    """Pairs per reward-model optimizer step."""
    reward_max_length: int | None = None
    """Tokenizer truncation length; None uses the tokenizer's ``model_max_length``."""
    reward_freeze_backbone: bool = False
    """Train only the scalar head (the backbone gets requires_grad=False)."""
    reward_length_features: str = "off"
    """Ours: length-aware head (docs/preference.md §8.2; see
    :func:`comlrl_lightning.reward_model.response_length_features`): "off" (upstream), "add" (a linear head on each
    agent's response length is added to the backbone's score) or "only" (the reward is that length head alone, the
    backbone is not run: a length-only reward model). For preferences that depend on response lengths, which a small
    backbone cannot count from its last token."""

    def check_reward_model_fields(self) -> None:
        """Validate every option of the group (raises ``ValueError`` naming the option, the value and what is
        allowed)."""
        if self.reward_model_name is not None and not isinstance(self.reward_model_name, str):
            raise bad_option("reward_model_name must be a string (hub id, local folder, 'embedded:tiny') or null.",
                             self.reward_model_name,
                             "strings or null; pass model objects to JointRewardModel(model=...)")
        lr = self.reward_learning_rate
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (lr > 0 and math.isfinite(lr)):
            raise bad_option("reward_learning_rate must be > 0.", lr, "finite numbers > 0")
        for name in ("reward_num_train_epochs", "reward_train_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad_option(f"{name} must be >= 1.", value, "integers >= 1")
        m = self.reward_max_length
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise bad_option("reward_max_length must be >= 1 or null.", m, "integers >= 1 or null")
        if not isinstance(self.reward_freeze_backbone, bool):
            raise bad_option("reward_freeze_backbone must be a bool.", self.reward_freeze_backbone, "true, false")
        if self.reward_length_features not in LENGTH_FEATURE_MODES:
            raise bad_option("reward_length_features must be one of off, add, only.", self.reward_length_features,
                             ", ".join(LENGTH_FEATURE_MODES))


@dataclass
class RewardModelOptions(RewardModelFields):
    """The reward-model options on their own (docs/preference.md §2.2), validated when built."""

    def __post_init__(self) -> None:
        self.check_reward_model_fields()

    @property
    def num_train_epochs(self) -> int:
        """Alias of ``reward_num_train_epochs``: the CLI derives ``trainer.max_epochs`` from it."""
        return self.reward_num_train_epochs

    def to_dict(self) -> dict[str, Any]:
        """Plain-type dict of every option."""
        return asdict(self)


register_yaml_representers(RewardModelOptions)  # hparams.yaml stays yaml.safe_load-able
