"""Configs of the MAGRPO family (MAGRPO, MAREINFORCE, MARLOO, MAReMax): docs/multiturn.md §1.1.

Option names, defaults and allowed values are upstream's, with our decisions applied: ``joint_mode`` is
validated and normalised here ("align" → "aligned", "crossed" → "cross"), ``early_termination_threshold``
defaults to None and ``num_turns`` to 1 so a single-turn run needs no transition, and ``advantage_mode`` is
validated here rather than in the trainer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

from comlrl_lightning.config.checks import bad_option
from comlrl_lightning.config.devices import DeviceOptions, check_device_list, normalize_parallel_training
from comlrl_lightning.config.reference_kl import ReferenceKLOptions, check_reference_devices, check_reference_kl_coef
from comlrl_lightning.config.rollout import (
    AdvantageModeOptions,
    EngineCheckOptions,
    GenerationBatchOptions,
    RolloutOptions,
    check_advantage_mode,
    check_discount,
    check_early_termination_threshold,
    check_generation_batch_size,
    check_logprob_gap_threshold,
)
from comlrl_lightning.config.sampling import (
    JointModeOptions,
    NumGenerationsOptions,
    SamplingOptions,
    check_num_generations,
    check_sampling,
    normalize_joint_mode,
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
class MAGRPOConfig(SeedOptions, ReferenceKLOptions, AdvantageModeOptions, BatchOptions, JointModeOptions,
                   EngineCheckOptions, GenerationBatchOptions, RolloutOptions, SamplingOptions, NumGenerationsOptions,
                   DeviceOptions, TrainingOptions):
    """Options of the MAGRPO trainer (and, through the subclasses, MAREINFORCE / MARLOO / MAReMax)."""

    _method = "MAGRPO"

    def __post_init__(self) -> None:
        check_training_counts(self)
        check_train_batch_size(self)
        check_num_generations(self, 2, "num_generations must be >= 2 (group baseline requires multiple samples).")
        normalize_parallel_training(self)
        check_device_list(self, "agent_devices", self.num_agents)
        normalize_joint_mode(self)
        check_advantage_mode(self)
        check_reference_kl_coef(self)
        check_reference_devices(self)
        check_early_termination_threshold(self)
        check_sampling(self)
        check_agent_learning_rate(self)
        check_discount(self)
        check_generation_batch_size(self)
        check_logprob_gap_threshold(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain-type dict of every option (for logging and checkpoints)."""
        return asdict(self)


@dataclass
class MAREINFORCEConfig(MAGRPOConfig):
    """MAGRPO with the raw-return baseline (A = G')."""

    advantage_mode: str = "raw"
    """Baseline: raw by default (see :class:`MAGRPOConfig`)."""
    _method = "MAREINFORCE"


@dataclass
class MARLOOConfig(MAGRPOConfig):
    """MAGRPO with the leave-one-out baseline."""

    advantage_mode: str = "rloo"
    """Baseline: rloo by default (see :class:`MAGRPOConfig`)."""
    _method = "MARLOO"


@dataclass
class MAReMaxConfig(MAGRPOConfig):
    """MAGRPO with the group-max baseline."""

    advantage_mode: str = "max"
    """Baseline: max by default (see :class:`MAGRPOConfig`)."""
    _method = "MAReMax"


@dataclass
class CentralizedMAGRPOConfig(MAGRPOConfig):
    """MAGRPO with one joint policy writing every role's output in one text (CoMLRL 1.4.3's
    ``CentralizedMAGRPOConfig``): ``num_agents`` is the number of roles; one actor model is trained."""

    num_turns: int = 1
    """Turns per episode: 1 only (as CoMLRL)."""
    collaboration_mode: str = "centralized"
    """Always "centralized" (kept as an option for CoMLRL's scripts, which pass it)."""
    _method = "CentralizedMAGRPO"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.collaboration_mode != "centralized":
            raise bad_option("CentralizedMAGRPOConfig requires centralized collaboration: collaboration_mode must be "
                             "'centralized'.", self.collaboration_mode, "'centralized'")
        if self.num_turns != 1:
            raise bad_option("Centralized MAGRPO currently supports num_turns=1 only (as CoMLRL 1.4.3).",
                             self.num_turns, "1")

    def learner_args(self) -> MAGRPOConfig:
        """The joint learner's options: a plain :class:`MAGRPOConfig` with ``num_agents=1`` (one actor model)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(MAGRPOConfig) if f.init}
        return MAGRPOConfig(**{**fields, "num_agents": 1})
