"""CoMLRL's import path ``comlrl.trainers.reinforce``, kept as a thin alias (docs/coming-from-comlrl.md).

The MAGRPO family's trainers live in :mod:`comlrl_lightning.trainers.magrpo`; this module re-exports every name
CoMLRL 1.4.3's package exports, so ``from comlrl.trainers.reinforce import ...`` ports by changing the prefix.
"""

from comlrl_lightning.trainers.magrpo import (
    CentralizedMAGRPOConfig,
    CentralizedMAGRPOTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
    MARLOOConfig,
    MARLOOTrainer,
)

__all__ = ["CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer", "MAGRPOConfig", "MAGRPOTrainer",
           "MAREINFORCEConfig", "MAREINFORCETrainer", "MAReMaxConfig", "MAReMaxTrainer", "MARLOOConfig",
           "MARLOOTrainer"]
