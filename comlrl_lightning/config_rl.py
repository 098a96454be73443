"""The MAGRPO-family configs (they live in :mod:`comlrl_lightning.config`; re-exported here for existing imports)
and :class:`CentralizedMAGRPOConfig`, the options of CoMLRL 1.4.3's ``CentralizedMAGRPOTrainer``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from comlrl_lightning.config.checks import _bad
from comlrl_lightning.config.rl import MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig

__all__ = ["CentralizedMAGRPOConfig", "MAGRPOConfig", "MAREINFORCEConfig", "MAReMaxConfig", "MARLOOConfig"]


@dataclass
class CentralizedMAGRPOConfig(MAGRPOConfig):
    """MAGRPO with one joint policy writing every role's output in one text (CoMLRL 1.4.3's
    ``CentralizedMAGRPOConfig``): ``num_agents`` is the number of roles; one actor model is trained."""

    num_turns: int = 1
    """Turns per episode: 1 only (as CoMLRL)."""
    collaboration_mode: str = "centralized"
    """Always "centralized" (kept as an option for CoMLRL's scripts, which pass it)."""
    _method = "CentralizedMAGRPO"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.collaboration_mode != "centralized":
            raise _bad("CentralizedMAGRPOConfig requires centralized collaboration: collaboration_mode must be "
                       "'centralized'.", self.collaboration_mode, "'centralized'")
        if self.num_turns != 1:
            raise _bad("Centralized MAGRPO currently supports num_turns=1 only (as CoMLRL 1.4.3).", self.num_turns,
                       "1")

    def learner_args(self) -> MAGRPOConfig:
        """The joint learner's options: a plain :class:`MAGRPOConfig` with ``num_agents=1`` (one actor model)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(MAGRPOConfig) if f.init}
        return MAGRPOConfig(**{**fields, "num_agents": 1})
