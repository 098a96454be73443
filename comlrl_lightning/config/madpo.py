"""MADPO's configs: :class:`MADPOConfig` and :class:`MADPOIterConfig` (docs/preference.md §2.1, §2.3, §2.4).

Each is a flat dataclass with CoMLRL 1.4.3's option names, composed from the option groups of this package;
every option is validated when the object is built, in the order of docs/preference.md §2.6 so that the first error
matches upstream's.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any

from comlrl_lightning.config.checks import bad_option, check_counts, check_optional_count, check_positive, is_int
from comlrl_lightning.config.devices import DeviceOptions, check_device_list, normalize_parallel_training
from comlrl_lightning.config.iterative import IterativePreferenceOptions
from comlrl_lightning.config.reference_kl import ReferenceKLOptions, check_reference_kl_coef
from comlrl_lightning.config.rollout import (
    AdvantageModeOptions,
    RolloutOptions,
    check_advantage_mode,
    check_discount,
    check_early_termination_threshold,
)
from comlrl_lightning.config.sampling import JointModeOptions, SamplingOptions, check_sampling, normalize_joint_mode
from comlrl_lightning.config.training import (
    BatchOptions,
    SeedOptions,
    TrainingOptions,
    check_agent_learning_rate,
    check_train_batch_size,
    check_training_counts,
)


@dataclass
class CollaborationOptions:
    """Who writes which part of the joint response."""

    collaboration_mode: str = "decentralized"
    """"decentralized" (one model per role) or "centralized" (one learner writing every role's output in one joint
    text; iterative configs then force comparator_generation_mode="centralized")."""


@dataclass
class PreferenceOptions:
    """Preference collection and the DPO objective."""

    preference_num_candidates: int = 80
    """Samples per agent per task item (N)."""
    preference_pairs_per_sample: int | None = 16
    """Maximum pairs kept per task item; None keeps all."""
    pair_selection: str = "reward_gap"
    """reward_gap (largest gaps first), all (every non-tied pair; needs a null limit) or random."""
    dpo_beta: float = 0.1
    """DPO temperature (eta) in -log sigmoid(eta * joint margin)."""
    use_environment_step: bool = True
    """Advance ``env_step`` during DPO updates."""
    environment_steps_per_pair: int = 2
    """env_step increment per trained pair."""


@dataclass
class OptimizerOptions:
    """Ours: gradient clipping and accumulation of the agents' optimizers."""

    gradient_clip_val: float | None = None
    """Clip each agent's gradient norm to this value (None = no clipping)."""
    gradient_accumulation_steps: int = 1
    """Optimizer steps happen every this many batches."""


@dataclass
class MADPOConfig(OptimizerOptions, SeedOptions, PreferenceOptions, ReferenceKLOptions, AdvantageModeOptions,
                  BatchOptions, JointModeOptions, RolloutOptions, SamplingOptions, DeviceOptions,
                  CollaborationOptions, TrainingOptions):
    """Options of the offline MADPO trainer (docs/preference.md §2.1).

    Attributes are documented one per line; defaults are upstream's. The RL-stage options (advantage_*,
    discount, early_termination_threshold, reference_kl_*) are used by MARLHF; MADPO is reference-free.
    """

    _allowed_pair_selection = ("reward_gap", "all", "random")
    _method = "MADPO"

    def __post_init__(self) -> None:
        self._validate_base()

    # Validation order follows docs/preference.md §2.6 so that the first error matches upstream's.
    def _validate_base(self) -> None:
        if self.collaboration_mode not in ("decentralized", "centralized"):
            raise bad_option("collaboration_mode must be decentralized or centralized.", self.collaboration_mode,
                             "decentralized, centralized")
        check_training_counts(self)
        check_train_batch_size(self)
        normalize_parallel_training(self)
        check_device_list(self, "agent_devices", self.num_agents)
        check_reference_kl_coef(self)
        self._validate_reference_kl()
        if self.num_turns != 1:
            raise bad_option("MADPO currently supports num_turns=1 only.", self.num_turns, "1")
        if not is_int(self.preference_num_candidates) or self.preference_num_candidates < 2:
            raise bad_option("preference_num_candidates must be >= 2.", self.preference_num_candidates,
                             "integers >= 2")
        check_optional_count("preference_pairs_per_sample", self.preference_pairs_per_sample)
        check_positive("dpo_beta", self.dpo_beta)
        check_counts(self, ("environment_steps_per_pair",))
        ps = "reward_gap" if self.pair_selection in (None, "") else str(self.pair_selection).strip().lower()
        if ps not in self._allowed_pair_selection:
            allowed = ", ".join(self._allowed_pair_selection)
            raise bad_option(f"pair_selection must be one of: {allowed}.", self.pair_selection, allowed)
        if ps == "all" and self.preference_pairs_per_sample is not None:
            raise bad_option("preference_pairs_per_sample must be null when pair_selection='all'.",
                             self.preference_pairs_per_sample, "null")
        self.pair_selection = ps
        # docs/decisions.md, decision 1: joint_mode is checked here, not at generation time.
        given = self.joint_mode
        if normalize_joint_mode(self) != "aligned":
            raise bad_option(f"{self._method} preference generation currently supports aligned joint_mode only.",
                             given, "aligned, align")
        check_counts(self, ("gradient_accumulation_steps",))
        check_positive("gradient_clip_val", self.gradient_clip_val, nullable=True)
        check_sampling(self)
        check_agent_learning_rate(self)
        check_discount(self)
        check_early_termination_threshold(self)
        check_advantage_mode(self)

    def _validate_reference_kl(self) -> None:
        # docs/decisions.md, decision 2: MADPO is reference-free; the option is accepted for compatibility and ignored.
        if self.reference_kl_enabled:
            warnings.warn(
                f"{type(self).__name__}: reference_kl_enabled=True has no effect; MADPO is reference-free, "
                "so no reference model is loaded and no KL term is added.",
                UserWarning,
                stacklevel=4,
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain-type dict of every option (for logging and checkpoints)."""
        return asdict(self)


@dataclass(repr=False)
class MADPOIterConfig(IterativePreferenceOptions, MADPOConfig):
    """Options of the iterative MADPO trainer: the base options plus docs/preference.md §2.3 (defaults of
    docs/preference.md §2.4)."""

    num_train_epochs: int = 1
    """DPO epochs per round."""
    preference_num_candidates: int = 20
    """Samples per agent per task item (N)."""
    preference_pairs_per_sample: int | None = 4
    """Maximum pairs kept per task item; None keeps all."""
    pair_selection: str = "comparator_reward"
    """comparator_reward (policy sample vs comparator sample), reward_gap, all or random."""

    _allowed_pair_selection = ("reward_gap", "all", "random", "comparator_reward")
    _method = "MADPOIter"

    def __post_init__(self) -> None:
        self._validate_base()
        self._validate_iterative()


#: The facades that implement ``collaboration_mode="centralized"`` (one learner writes every role).
CENTRALIZED_FACADES = "MADPOTrainer, MADPOIterTrainer, MARLHFTrainer or MARLHFIterTrainer"


def refuse_centralized_learner(args: Any, where: str) -> None:
    """``collaboration_mode="centralized"`` takes effect through the facades, which give one learner the joint
    prompt and parse its roles (their module's args say "decentralized"). A module whose args still say
    "centralized" was built around them (module/YAML path) and would train ``num_agents`` separate learners: refused
    at setup, naming what to use."""
    if getattr(args, "collaboration_mode", None) == "centralized":
        raise ValueError(
            f"{where}: collaboration_mode='centralized' takes effect only through {CENTRALIZED_FACADES} (one learner "
            f"writes all {args.num_agents} roles in a joint text); a module given these args directly (the "
            f"module/YAML path) would train {args.num_agents} decentralized learners. Use the facade, or set "
            "collaboration_mode='decentralized'.")
