"""Kept for existing imports: the actor-critic configs now live in :mod:`comlrl_lightning.config`."""

from comlrl_lightning.config.actor_critic import IACConfig, MAACConfig, _ActorCriticOptions

__all__ = ["IACConfig", "MAACConfig", "_ActorCriticOptions"]
