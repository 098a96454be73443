"""comlrl-lightning: PyTorch Lightning modules, data modules, callbacks and CoMLRL-style trainers for teams
of cooperating LLM agents.

The public names below are importable from the package root (``from comlrl_lightning import MADPOTrainer``).
They load on first use (PEP 562), so ``import comlrl_lightning`` alone stays cheap: no lightning, torch or
transformers until a name that needs them is touched.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
PUBLIC_HOMES: dict[str, str] = {
    # facades
    "MADPOTrainer": "comlrl_lightning.trainers.madpo",
    "MADPOIterTrainer": "comlrl_lightning.trainers.madpo",
    "MAGRPOTrainer": "comlrl_lightning.trainers.magrpo",
    "MAREINFORCETrainer": "comlrl_lightning.trainers.magrpo",
    "MARLOOTrainer": "comlrl_lightning.trainers.magrpo",
    "MAReMaxTrainer": "comlrl_lightning.trainers.magrpo",
    "CentralizedMAGRPOTrainer": "comlrl_lightning.trainers.magrpo",
    "IACTrainer": "comlrl_lightning.trainers.actor_critic",
    "MAACTrainer": "comlrl_lightning.trainers.actor_critic",
    "MARLHFTrainer": "comlrl_lightning.trainers.marlhf",
    "MARLHFIterTrainer": "comlrl_lightning.trainers.marlhf",
    # configs
    "MADPOConfig": "comlrl_lightning.config",
    "MADPOIterConfig": "comlrl_lightning.config",
    "MARLHFConfig": "comlrl_lightning.config",
    "MARLHFIterConfig": "comlrl_lightning.config",
    "MAGRPOConfig": "comlrl_lightning.config",
    "MAREINFORCEConfig": "comlrl_lightning.config",
    "MARLOOConfig": "comlrl_lightning.config",
    "MAReMaxConfig": "comlrl_lightning.config",
    "CentralizedMAGRPOConfig": "comlrl_lightning.config.magrpo",
    "IACConfig": "comlrl_lightning.config",
    "MAACConfig": "comlrl_lightning.config",
    # LightningModules
    "MADPOModule": "comlrl_lightning.modules.madpo",
    "MAGRPOModule": "comlrl_lightning.modules.magrpo",
    "CentralizedMAGRPOModule": "comlrl_lightning.modules.centralized_magrpo",
    "ActorCriticModule": "comlrl_lightning.modules.actor_critic",
    "IACModule": "comlrl_lightning.modules.actor_critic",
    "MAACModule": "comlrl_lightning.modules.actor_critic",
    "MARLHFModule": "comlrl_lightning.modules.marlhf",
    "MARLHFActorCriticModule": "comlrl_lightning.modules.marlhf",
    "JointRewardModel": "comlrl_lightning.modules.reward_model",
    # LightningDataModules
    "PreferenceDataModule": "comlrl_lightning.data.madpo",
    "IterativePreferenceDataModule": "comlrl_lightning.data.madpo",
    "MARLHFIterDataModule": "comlrl_lightning.data.marlhf",
    "TaskDataModule": "comlrl_lightning.data.task",
    "CentralizedTaskDataModule": "comlrl_lightning.data.centralized",
    "RewardPairDataModule": "comlrl_lightning.data.reward_model",
    # the embedded offline default model
    "build_tiny_model": "comlrl_lightning.tiny",
}

__all__ = ["__version__", *PUBLIC_HOMES]


def __getattr__(name: str) -> Any:
    module = PUBLIC_HOMES.get(name)
    if module is None:
        raise AttributeError(f"module 'comlrl_lightning' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *PUBLIC_HOMES})
