"""CoMLRL's import path ``comlrl.trainers.preference``, kept as a thin alias (docs/coming-from-comlrl.md).

The preference trainers live by method: :mod:`comlrl_lightning.trainers.madpo` (MADPO, MADPOIter) and
:mod:`comlrl_lightning.trainers.marlhf` (MARLHF, MARLHFIter). This module re-exports every name CoMLRL 1.4.3's
package exports, so ``from comlrl.trainers.preference import ...`` ports by changing the prefix.
"""

from comlrl_lightning.comparators.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from comlrl_lightning.config import MADPOConfig, MADPOIterConfig, MARLHFConfig, MARLHFIterConfig
from comlrl_lightning.modules.reward_model import JointRewardModel
from comlrl_lightning.trainers.madpo import MADPOIterTrainer, MADPOTrainer
from comlrl_lightning.trainers.marlhf import MARLHFIterTrainer, MARLHFTrainer

__all__ = ["CentralizedComparatorAdapter", "CentralizedComparatorParseError", "JointRewardModel", "MADPOConfig",
           "MADPOIterConfig", "MADPOIterTrainer", "MADPOTrainer", "MARLHFConfig", "MARLHFIterConfig",
           "MARLHFIterTrainer", "MARLHFTrainer", "TaggedCentralizedComparatorAdapter"]
