"""Facades that assemble a Lightning Trainer, a module, a data module and callbacks.

The names CoMLRL exports from ``comlrl.trainers`` are importable from here too (loaded on first use); the
mapping of every CoMLRL module path is in docs/coming-from-comlrl.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ActorCriticTrainerBase": "comlrl_lightning.trainers.actor_critic",
    "CentralizedMAGRPOConfig": "comlrl_lightning.config_rl",
    "CentralizedMAGRPOTrainer": "comlrl_lightning.trainers.reinforce",
    "IACConfig": "comlrl_lightning.config",
    "IACTrainer": "comlrl_lightning.trainers.actor_critic",
    "MAACConfig": "comlrl_lightning.config",
    "MAACTrainer": "comlrl_lightning.trainers.actor_critic",
    "MAGRPOConfig": "comlrl_lightning.config",
    "MAGRPOTrainer": "comlrl_lightning.trainers.reinforce",
    "MADPOConfig": "comlrl_lightning.config",
    "MADPOTrainer": "comlrl_lightning.trainers.preference",
    "MARLHFConfig": "comlrl_lightning.config",
    "MARLHFTrainer": "comlrl_lightning.trainers.marlhf",
    "JointRewardModel": "comlrl_lightning.modules.reward_model",
    "MAREINFORCEConfig": "comlrl_lightning.config",
    "MAREINFORCETrainer": "comlrl_lightning.trainers.reinforce",
    "MAReMaxConfig": "comlrl_lightning.config",
    "MAReMaxTrainer": "comlrl_lightning.trainers.reinforce",
    "MARLOOConfig": "comlrl_lightning.config",
    "MARLOOTrainer": "comlrl_lightning.trainers.reinforce",
}
__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
