"""Kept for existing imports: the MARLHF configs now live in :mod:`comlrl_lightning.config`."""

from comlrl_lightning.config.marlhf import (
    MAGRPO_FAMILY,
    RL_ALGORITHM_ALIASES,
    RL_ALGORITHMS,
    SCORING_REWARD_ALIASES,
    MARLHFConfig,
    MARLHFIterConfig,
)

__all__ = ["MAGRPO_FAMILY", "RL_ALGORITHMS", "RL_ALGORITHM_ALIASES", "SCORING_REWARD_ALIASES", "MARLHFConfig",
           "MARLHFIterConfig"]
