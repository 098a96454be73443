"""Facades that assemble a Lightning Trainer, a module, a data module and callbacks, one file per method
(``madpo``, ``magrpo``, ``marlhf``, ``actor_critic``).

Every name CoMLRL exports from ``comlrl.trainers`` is importable from here; CoMLRL's package paths
``trainers.preference`` and ``trainers.reinforce`` are thin aliases (docs/coming-from-comlrl.md).
"""

from comlrl_lightning.config import (
    IACConfig,
    MAACConfig,
    MADPOConfig,
    MAGRPOConfig,
    MAREINFORCEConfig,
    MAReMaxConfig,
    MARLHFConfig,
    MARLOOConfig,
)
from comlrl_lightning.config.magrpo import CentralizedMAGRPOConfig
from comlrl_lightning.modules.reward_model import JointRewardModel
from comlrl_lightning.trainers.actor_critic import ActorCriticTrainerBase, IACTrainer, MAACTrainer
from comlrl_lightning.trainers.madpo import MADPOTrainer
from comlrl_lightning.trainers.magrpo import (
    CentralizedMAGRPOTrainer,
    MAGRPOTrainer,
    MAREINFORCETrainer,
    MAReMaxTrainer,
    MARLOOTrainer,
)
from comlrl_lightning.trainers.marlhf import MARLHFTrainer

__all__ = ["ActorCriticTrainerBase", "CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer", "IACConfig", "IACTrainer",
           "JointRewardModel", "MAACConfig", "MAACTrainer", "MADPOConfig", "MADPOTrainer", "MAGRPOConfig",
           "MAGRPOTrainer", "MARLHFConfig", "MARLHFTrainer", "MAREINFORCEConfig", "MAREINFORCETrainer",
           "MARLOOConfig", "MARLOOTrainer", "MAReMaxConfig", "MAReMaxTrainer"]
