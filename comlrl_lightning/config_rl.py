"""Kept for existing imports: the MAGRPO-family configs now live in :mod:`comlrl_lightning.config`."""

from comlrl_lightning.config.rl import MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig

__all__ = ["MAGRPOConfig", "MAREINFORCEConfig", "MAReMaxConfig", "MARLOOConfig"]
