"""Dataclass configs with the option names of the spec (CoMLRL 1.4.3 public API).

Every public config is a flat dataclass composed from small option groups (``training``, ``sampling``,
``rollout``, ``devices``, ``reference_kl``, ``critic``, ``iterative``); each option's rule and message live
once, in the group that declares the option. Every option is validated when the object is built
(``__post_init__``); a bad value raises ``ValueError`` whose message starts with upstream's sentence (so code
written against CoMLRL keeps matching) and adds the value given and what is allowed.
"""

from comlrl_lightning.config.actor_critic import ActorCriticOptions, IACConfig, MAACConfig
from comlrl_lightning.config.checks import bad_option, check_counts, is_int, is_number, normalize_choice
from comlrl_lightning.config.devices import device_count, normalize_parallel_training
from comlrl_lightning.config.iterative import (
    API_FORMAT_ALIASES,
    COMPARATOR_POLICY_ALIASES,
    GENERATION_MODE_ALIASES,
    REPLAY_MODE_ALIASES,
    IterativePreferenceOptions,
)
from comlrl_lightning.config.madpo import MADPOConfig, MADPOIterConfig
from comlrl_lightning.config.magrpo import (
    CentralizedMAGRPOConfig,
    MAGRPOConfig,
    MAREINFORCEConfig,
    MAReMaxConfig,
    MARLOOConfig,
)
from comlrl_lightning.config.marlhf import (
    MAGRPO_FAMILY,
    RL_ALGORITHM_ALIASES,
    RL_ALGORITHMS,
    SCORING_REWARD_ALIASES,
    MARLHFConfig,
    MARLHFIterConfig,
)
from comlrl_lightning.config.reference_kl import check_reference_devices
from comlrl_lightning.config.representers import register_config_classes, register_yaml_representers
from comlrl_lightning.config.reward_model import RewardModelOptions
from comlrl_lightning.config.sampling import JOINT_MODE_ALIASES, check_sampling
from comlrl_lightning.config.secrets import SECRET_HEADER_WORDS, redact_secrets

# Every public config dataclass: the ``args`` a module saves among its hyper-parameters (a checkpoint holds the
# object, so weights_only loading allow-lists these classes: comlrl_lightning.modules.base).
CONFIG_CLASSES = (MADPOConfig, MADPOIterConfig, MAGRPOConfig, MAREINFORCEConfig, MARLOOConfig, MAReMaxConfig,
                  CentralizedMAGRPOConfig, IACConfig, MAACConfig, MARLHFConfig, MARLHFIterConfig)

__all__ = [
    "CONFIG_CLASSES",
    "CentralizedMAGRPOConfig",
    "API_FORMAT_ALIASES",
    "COMPARATOR_POLICY_ALIASES",
    "GENERATION_MODE_ALIASES",
    "IACConfig",
    "JOINT_MODE_ALIASES",
    "MAACConfig",
    "MADPOConfig",
    "MADPOIterConfig",
    "MAGRPOConfig",
    "MAGRPO_FAMILY",
    "MAREINFORCEConfig",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "MARLOOConfig",
    "MAReMaxConfig",
    "REPLAY_MODE_ALIASES",
    "RewardModelOptions",
    "RL_ALGORITHMS",
    "RL_ALGORITHM_ALIASES",
    "SCORING_REWARD_ALIASES",
    "ActorCriticOptions",
    "IterativePreferenceOptions",
    "SECRET_HEADER_WORDS",
    "bad_option",
    "normalize_choice",
    "check_counts",
    "check_reference_devices",
    "check_sampling",
    "device_count",
    "is_int",
    "is_number",
    "normalize_parallel_training",
    "redact_secrets",
    "register_config_classes",
    "register_yaml_representers",
]


register_yaml_representers(*CONFIG_CLASSES)
