"""LightningModules."""

from comlrl_lightning.modules.madpo import MADPOModule

__all__ = ["MADPOModule"]
