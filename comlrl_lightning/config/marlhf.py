"""Configs of MARLHF (reward model + online RL) and its iterative variant (docs/preference.md §2.2, §2.4).

``MARLHFConfig`` = every ``MADPOConfig`` option plus the reward-model, RL-backend and critic options.
``MARLHFIterConfig`` adds the iterative options (docs/preference.md §2.3) with MARLHFIter's defaults
(docs/preference.md §2.4) and ``preference_scoring_reward``. Validation order follows docs/preference.md §2.2/§2.6:
``rl_algorithm`` is normalised, the MADPO checks run, then the MARLHF checks, then (iterative) the iterative checks and
the scoring reward.

Differences from upstream, all from our decisions: ``reward_model_device`` defaults to None = the
Lightning accelerator the run uses (docs/decisions.md, decision 7; upstream: "cuda:0"); ``reference_kl_*`` is *used* by
MARLHF's RL stage (so no "reference-free" warning), its ``reference_devices`` length is checked.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from comlrl_lightning.config.actor_critic import IACConfig, MAACConfig
from comlrl_lightning.config.checks import bad_option, is_number, normalize_choice
from comlrl_lightning.config.critic import (
    CriticOptions,
    ValueHeadOptions,
    check_critic_learning_rate,
    check_value_head_options,
    check_value_loss_coef,
    normalize_critic_type,
)
from comlrl_lightning.config.devices import check_device_list, check_devices_exist, warn_unused_devices
from comlrl_lightning.config.iterative import IterativePreferenceOptions
from comlrl_lightning.config.madpo import MADPOConfig
from comlrl_lightning.config.reference_kl import check_reference_devices
from comlrl_lightning.config.reward_model import RewardModelFields, RewardModelOptions
from comlrl_lightning.config.rollout import (
    EngineCheckOptions,
    GenerationBatchOptions,
    check_generation_batch_size,
    check_logprob_gap_threshold,
)
from comlrl_lightning.config.sampling import NumGenerationsOptions, check_num_generations

#: rl_algorithm → the advantage_mode it forces (MAGRPO family); maac/iac leave advantage_mode alone.
MAGRPO_FAMILY = {"magrpo": "mean", "mareinforce": "raw", "maremax": "max", "marloo": "rloo"}
RL_ALGORITHMS = ("magrpo", "mareinforce", "maremax", "marloo", "maac", "iac")
RL_ALGORITHM_ALIASES = {"mareforce": "mareinforce"}
SCORING_REWARD_ALIASES = {
    "task": "task", "oracle": "task", "environment": "task", "env": "task",
    "reward_model": "reward_model", "model": "reward_model", "learned": "reward_model",
}


@dataclass
class RLAlgorithmOptions:
    """Which online-RL backend MARLHF's RL stage runs."""

    rl_algorithm: str = "magrpo"
    """Online-RL backend: magrpo, mareinforce (alias mareforce), maremax, marloo, maac or iac."""


@dataclass
class RewardModelUseOptions:
    """Where MARLHF runs its learned reward model and how the RL stage clips its reward (the model's own options are
    :class:`~comlrl_lightning.config.reward_model.RewardModelFields`)."""

    reward_model_device: str | None = None
    """Reward-model device; None = the Lightning accelerator in use (docs/decisions.md, decision 7; upstream:
    "cuda:0")."""
    reward_clip_quantile: float | None = None
    """Ours: the RL reward is min(r, b), b = this quantile of the scores the fitted reward model gives the responses
    of its own training pairs (docs/preference.md §8.5); None = no clip (upstream). In (0, 1]."""


@dataclass
class CriticModelOptions:
    """Where MARLHF's maac/iac critics come from."""

    critic_model_name: str | None = None
    """maac/iac critic source; None = the agents' model name (must then be a string)."""


@dataclass
class MARLHFConfig(ValueHeadOptions, CriticOptions, CriticModelOptions, RewardModelUseOptions, RewardModelFields,
                   NumGenerationsOptions,
                   RLAlgorithmOptions, EngineCheckOptions, GenerationBatchOptions,
                   MADPOConfig):
    """Options of the MARLHF trainer: MADPO's (docs/preference.md §2.1) plus docs/preference.md §2.2.

    ``advantage_mode`` is forced from ``rl_algorithm`` (magrpo→mean, mareinforce→raw, maremax→max,
    marloo→rloo), as upstream does; a user value is replaced. ``num_generations`` must be >= 2 for the MAGRPO
    family and >= 1 for maac/iac; the critic options (``critic_*``, ``value_*``, ``use_separate_critic``)
    are used by maac/iac only.
    """

    critic_learning_rate: float | None = None
    """Critic learning rate; None = ``agent_learning_rate``."""

    def _validate_base(self) -> None:
        # docs/preference.md §2.2 order: normalise rl_algorithm, run every MADPO check, then the MARLHF checks.
        alg = "magrpo" if self.rl_algorithm is None else str(self.rl_algorithm).strip().lower()
        self.rl_algorithm = RL_ALGORITHM_ALIASES.get(alg, alg)
        super()._validate_base()
        self._validate_marlhf()

    def _validate_reference_kl(self) -> None:
        # MARLHF uses the reference KL in its RL stage (docs/preference.md §8.6): check the devices instead of warning.
        check_reference_devices(self)

    def _validate_marlhf(self) -> None:
        if self.rl_algorithm not in RL_ALGORITHMS:
            allowed = ", ".join(RL_ALGORITHMS)
            raise bad_option(f"rl_algorithm must be one of: {allowed}.", self.rl_algorithm,
                             f"{allowed} (alias: mareforce)")
        if self.rl_algorithm in MAGRPO_FAMILY:
            check_num_generations(self, 2, "num_generations must be >= 2 for MAGRPO-family MARLHF backends.")
            self.advantage_mode = MAGRPO_FAMILY[self.rl_algorithm]
        else:
            check_num_generations(self, 1)
        check_generation_batch_size(self)
        check_logprob_gap_threshold(self)
        if self.reward_model_name is not None and not isinstance(self.reward_model_name, str):
            raise bad_option("reward_model_name must be provided when agent models are objects.",
                             self.reward_model_name, "a hub id, a local folder or 'embedded:tiny' (a string), or null")
        self.check_reward_model_fields()
        q = self.reward_clip_quantile
        if q is not None and (not is_number(q) or not 0 < q <= 1):
            raise bad_option("reward_clip_quantile must be in (0, 1] or null.", q,
                             "numbers in (0, 1], e.g. 0.95, or null (no clip)")
        if self.reward_model_device is not None:
            import torch

            device = str(self.reward_model_device)
            try:
                torch.device(device)
            except (RuntimeError, ValueError):
                raise bad_option("reward_model_device must be a torch device string or null.", self.reward_model_device,
                           "'cpu', 'cuda', 'cuda:1', 'mps', ... or null (= the Lightning accelerator)") from None
            self.reward_model_device = device
            check_devices_exist(self, "reward_model_device")
        if self.is_actor_critic:  # the critic count of the RL stage: one shared (maac) or one per agent (iac)
            check_device_list(self, "critic_devices", 1 if self.rl_algorithm == "maac" else self.num_agents)
        else:
            check_devices_exist(self, "critic_devices")
            warn_unused_devices(self, "critic_devices", f"rl_algorithm={self.rl_algorithm!r} has no critic "
                                "(critics: rl_algorithm='iac' or 'maac')")
        check_critic_learning_rate(self)
        normalize_critic_type(self)
        check_value_loss_coef(self)
        check_value_head_options(self)

    # --- derived option sets ---------------------------------------------------------------------------
    def reward_model_options(self) -> RewardModelOptions:
        """The reward-model options as a :class:`~comlrl_lightning.config.reward_model.RewardModelOptions`."""
        return RewardModelOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RewardModelFields)})

    @property
    def is_actor_critic(self) -> bool:
        """True for the maac/iac backends."""
        return self.rl_algorithm in ("maac", "iac")

    def actor_critic_config(self):
        """The IACConfig / MAACConfig of the maac/iac RL stage (docs/preference.md §9.2: the options MARLHF
        forwards)."""
        if not self.is_actor_critic:
            raise ValueError(f"actor_critic_config() needs rl_algorithm 'maac' or 'iac'; got {self.rl_algorithm!r}.")
        critic_devices = self.critic_devices
        if critic_devices is None and self.parallel_training == "mp":
            critic_devices = self.agent_devices
        common = {
            "agent_learning_rate": self.agent_learning_rate,
            "critic_learning_rate": (self.critic_learning_rate if self.critic_learning_rate is not None
                                     else self.agent_learning_rate),
            "rollout_buffer_size": self.rollout_buffer_size, "train_batch_size": self.train_batch_size,
            "value_loss_coef": self.value_loss_coef, "advantage_normalization": self.advantage_normalization,
            "max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "top_p": self.top_p,
            "top_k": self.top_k, "generation_backend": self.generation_backend, "vllm_kwargs": dict(self.vllm_kwargs),
            "num_train_epochs": self.num_train_epochs, "num_agents": self.num_agents,
            "num_generations": self.num_generations, "num_turns": self.num_turns,
            "parallel_training": self.parallel_training, "agent_devices": self.agent_devices,
            "agent_overlap": self.agent_overlap, "critic_devices": critic_devices,
            "external_prompt_passthrough": self.external_prompt_passthrough,
            "discount": self.discount, "critic_type": self.critic_type,
            "early_termination_threshold": self.early_termination_threshold, "eval_interval": self.eval_interval,
            "eval_num_samples": self.eval_num_samples, "eval_batch_size": self.eval_batch_size,
            "logging_steps": self.logging_steps, "reference_kl_enabled": self.reference_kl_enabled,
            "reference_kl_coef": self.reference_kl_coef, "reference_devices": self.reference_devices,
            "seed": self.seed, "generation_batch_size": self.generation_batch_size,
            "logprob_gap_threshold": self.logprob_gap_threshold,
        }
        if self.rl_algorithm == "maac":
            return MAACConfig(**common)
        return IACConfig(**common, use_separate_critic=self.use_separate_critic,
                         value_clip_range=self.value_clip_range,
                         critic_value_head_hidden_dim=self.critic_value_head_hidden_dim,
                         value_head_hidden_dim=self.value_head_hidden_dim)


@dataclass(repr=False)
class MARLHFIterConfig(IterativePreferenceOptions, MARLHFConfig):
    """Iterative MARLHF: MARLHF's options, the iterative options (docs/preference.md §2.3), MARLHFIter's defaults
    (docs/preference.md §2.4)."""

    num_train_epochs: int = 2
    """RL epochs per round."""
    preference_num_candidates: int = 20
    """Samples per agent per task item (N)."""
    preference_pairs_per_sample: int | None = 4
    """Maximum pairs kept per task item; None keeps all."""
    pair_selection: str = "comparator_reward"
    """comparator_reward (policy sample vs comparator sample), reward_gap, all or random."""
    reward_num_train_epochs: int = 2
    """Reward-model epochs per round, on a freshly built model."""
    preference_scoring_reward: str = "task"
    """Scores of new comparisons: "task" (the task reward) or "reward_model" (the latest fitted reward model,
    the task reward until one exists). Aliases: task|oracle|environment|env, reward_model|model|learned."""

    _allowed_pair_selection = ("reward_gap", "all", "random", "comparator_reward")
    _method = "MADPOIter"

    def __post_init__(self) -> None:
        self._validate_base()
        self._validate_iterative()
        self.preference_scoring_reward = normalize_choice(
            "preference_scoring_reward", self.preference_scoring_reward, SCORING_REWARD_ALIASES, "task",
            "preference_scoring_reward must be one of: task, reward_model.")


__all__ = ["MAGRPO_FAMILY", "RL_ALGORITHMS", "MARLHFConfig", "MARLHFIterConfig"]
