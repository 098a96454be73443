"""Where each member of the team lives under ``parallel_training="mp"`` (docs/architecture.md, "Devices"): a mixin
of :class:`~comlrl_lightning.modules.base.TeamModuleBase`.

Lightning moves the whole module to its root device at setup; :meth:`MemberPlacement.to` then puts each member
back on its own device (agent i's model on ``agent_devices[i]``; subclasses add critics and value heads through
:meth:`MemberPlacement.member_placement`). Tests: tests/modules/test_placement.py (CPU), test_placement_gpu.py.

The host (a LightningModule) provides ``team`` (set by ``init_team``) and ``args`` (``parallel_training``,
``agent_devices``).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import nn

from comlrl_lightning.devices import common_device, device_of, resolve_devices


class MemberPlacement(L.LightningModule):
    """``nn.Module.to`` that keeps each member on its device under ``parallel_training="mp"``."""

    def to(self, *args: Any, **kwargs: Any) -> MemberPlacement:
        """``nn.Module.to``, after which each member goes back to its own device under
        ``parallel_training="mp"`` (Lightning moves the whole module to its root device at setup)."""
        out = super().to(*args, **kwargs)
        self.place_members()
        return out

    def member_placement(self) -> list[tuple[nn.Module, torch.device]]:
        """(module, device) pairs of :meth:`place_members`: agent i's model on ``agent_devices[i]``; subclasses
        add critics and value heads. Empty unless ``parallel_training="mp"``."""
        if "team" not in vars(self) or self.args.parallel_training != "mp":  # not loaded yet, or not "mp"
            return []
        a = self.args
        devices = resolve_devices(a.agent_devices, self.team.num_agents, "agent_devices")
        if self.team.uses_lora and common_device(devices) is None:
            raise ValueError(f"agent_devices={a.agent_devices!r} puts LoRA agents on different devices, but they are "
                             "adapters of one shared base model, which lives on one device. Give one device "
                             "(agent_devices='cuda:0'), or load full-model agents (no lora) to spread them.")
        return list(zip(self.team.models, devices))

    def place_members(self) -> None:
        """Move each member to its device (:meth:`member_placement`). ``parallel_training="mp"`` places members
        inside one process; it cannot be combined with a strategy that runs several processes."""
        placement = self.member_placement()
        if not placement:
            return
        processes = self._trainer.world_size if self._trainer is not None else 1
        if processes > 1:
            raise ValueError(f"parallel_training='mp' places the agents on agent_devices={self.args.agent_devices!r} "
                             f"inside one process, but the trainer runs {processes} processes "
                             f"({type(self.trainer.strategy).__name__}). Use parallel_training='none' with a "
                             "multi-process strategy (each process then holds the whole team), or devices=1.")
        for module, device in placement:
            module.to(device)

    def agent_device(self, i: int) -> torch.device:
        """The device of agent i's model (the module's device when it has no parameters)."""
        return device_of(self.team.models[i], self.device)
