"""LightningModules, one file per method (docs/architecture.md): every public module class is importable from here."""

from comlrl_lightning.modules.actor_critic import ActorCriticModule, IACModule, MAACModule
from comlrl_lightning.modules.base import TeamModuleBase
from comlrl_lightning.modules.centralized_magrpo import CentralizedMAGRPOModule
from comlrl_lightning.modules.madpo import MADPOModule
from comlrl_lightning.modules.magrpo import MAGRPOModule
from comlrl_lightning.modules.marlhf import MARLHFActorCriticModule, MARLHFModule
from comlrl_lightning.modules.reward_model import JointRewardModel

__all__ = ["ActorCriticModule", "CentralizedMAGRPOModule", "IACModule", "JointRewardModel", "MAACModule",
           "MADPOModule", "MAGRPOModule", "MARLHFActorCriticModule", "MARLHFModule", "TeamModuleBase"]
