"""Configs of the actor-critic trainers: :class:`IACConfig` and :class:`MAACConfig` (docs/multiturn.md §1.2–1.3).

Option names and defaults are CoMLRL 1.4.3's, except ``early_termination_threshold`` (None) and
``num_turns`` (1), docs/decisions.md, decision 10: a single-turn run needs no transition. Every option is validated at
construction; messages name the option, the value and what is allowed, and start with upstream's sentence
where upstream has one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from comlrl_lightning.config.checks import bad_option
from comlrl_lightning.config.critic import (
    CriticOptions,
    ValueHeadOptions,
    check_critic_learning_rate,
    check_value_head_options,
    check_value_loss_coef,
    normalize_critic_type,
)
from comlrl_lightning.config.devices import (
    DeviceOptions,
    check_device_list,
    device_count,
    normalize_parallel_training,
)
from comlrl_lightning.config.reference_kl import ReferenceKLOptions, check_reference_devices, check_reference_kl_coef
from comlrl_lightning.config.rollout import (
    EngineCheckOptions,
    GenerationBatchOptions,
    RolloutOptions,
    check_discount,
    check_early_termination_threshold,
    check_generation_batch_size,
    check_logprob_gap_threshold,
)
from comlrl_lightning.config.sampling import (
    NumGenerationsOptions,
    SamplingOptions,
    check_num_generations,
    check_sampling,
)
from comlrl_lightning.config.training import (
    BatchOptions,
    SeedOptions,
    TrainingOptions,
    check_agent_learning_rate,
    check_train_batch_size,
    check_training_counts,
)


@dataclass
class ActorCriticOptions(SeedOptions, CriticOptions, ReferenceKLOptions, BatchOptions, EngineCheckOptions,
                          GenerationBatchOptions, RolloutOptions, SamplingOptions, NumGenerationsOptions, DeviceOptions,
                          TrainingOptions):
    """Options shared by IAC and MAAC (docs/multiturn.md §1.2; MAAC differences in docs/multiturn.md §1.3), with the
    actor-critic defaults."""

    num_train_epochs: int = 40
    """Passes over the train dataset."""
    logging_steps: int = 1
    """Minimum env-step distance between two training-metric logs."""
    num_generations: int = 1
    """Samples per agent per prompt (single-turn only; must be 1 when ``num_turns > 1``)."""
    top_k: int | None = None
    """Top-k sampling; None disables it."""
    rollout_buffer_size: int = 8
    """Samples per agent before an update; the whole buffer is drained then."""

    _method = "AC"

    def _separate_critics(self) -> bool:
        return True

    def _critic_count(self) -> int:
        return self.num_agents

    def __post_init__(self) -> None:
        check_training_counts(self)
        check_train_batch_size(self)
        check_num_generations(self, 1)
        if self.num_turns > 1 and self.num_generations != 1:
            raise bad_option(
                f"Multi-turn {self._method} currently supports num_generations == 1 (num_turns={self.num_turns}): "
                "a multi-turn episode is a single trajectory. Set num_generations=1, or num_turns=1 to sample "
                "several completions per prompt.", self.num_generations, "1 when num_turns > 1")
        normalize_critic_type(self)
        normalize_parallel_training(self)
        self._check_devices()
        check_reference_kl_coef(self)
        check_reference_devices(self)
        check_early_termination_threshold(self)
        check_sampling(self)
        check_agent_learning_rate(self)
        check_value_loss_coef(self)
        check_discount(self)
        check_generation_batch_size(self)
        check_logprob_gap_threshold(self)

    def _check_devices(self) -> None:
        pt = self.parallel_training
        if pt == "mp" and self._separate_critics() and self.critic_devices is None:
            raise bad_option("parallel_training='mp' requires explicit critic_devices.", self.critic_devices,
                             "a device string or a list of device strings")
        check_device_list(self, "agent_devices", self.num_agents)
        check_device_list(self, "critic_devices", self._critic_count())

    def to_dict(self) -> dict[str, Any]:
        """Plain-type dict of every option (for logging and checkpoints)."""
        return asdict(self)


@dataclass
class IACConfig(ValueHeadOptions, ActorCriticOptions):
    """Independent actor-critic (docs/multiturn.md §1.2): one critic per actor.

    The critic is a separate causal LM with a value head (``use_separate_critic=True``) or a value head on the
    actor itself (``False``; the actor optimizer then also trains the head).
    """

    _method = "IAC"

    def _separate_critics(self) -> bool:
        return bool(self.use_separate_critic)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_critic_learning_rate(self)
        if self.critic_learning_rate is None:
            self.critic_learning_rate = self.agent_learning_rate
        check_value_head_options(self)


@dataclass
class MAACConfig(ActorCriticOptions):
    """Multi-agent actor-critic with one centralised critic over the joint history (and joint action).

    Same options as IAC except: no ``use_separate_critic``/``value_clip_range``/head dims (the critic head's
    hidden dim is ``model_config["critic_value_head_hidden_dim"]``), ``critic_learning_rate`` must be a number,
    and ``critic_devices`` names exactly one device in "mp" mode.
    """

    _method = "MAAC"

    def _critic_count(self) -> int:
        return 1

    def __post_init__(self) -> None:
        super().__post_init__()
        check_critic_learning_rate(self, falls_back=False)
        if self.parallel_training == "mp" and device_count(self.critic_devices) not in (None, 1):
            raise bad_option("MAAC critic_devices must resolve to exactly one device.", self.critic_devices,
                             "one device string or a one-element list")
