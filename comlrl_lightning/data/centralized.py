"""CentralizedTaskDataModule: the task of a decentralized team (roles' prompts, team reward) served to one joint
learner (CoMLRL 1.4.3's ``CentralizedMAGRPOTrainer``; docs/coming-from-comlrl.md)."""

from __future__ import annotations

from typing import Any

from comlrl_lightning.collaboration import CentralizedPrompt, CentralizedReward, resolve_adapter
from comlrl_lightning.data.task import TaskDataModule
from comlrl_lightning.rewards import RewardOracle


class CentralizedTaskDataModule(TaskDataModule):
    """:class:`~comlrl_lightning.data.task.TaskDataModule` for one joint learner (CoMLRL's
    ``CentralizedMAGRPOTrainer``): ``num_agents`` is the number of roles, ``formatters`` the roles' own prompts,
    ``reward_func`` the team reward over the roles' outputs, exactly as for a decentralized team.

    The learner's only formatter is the adapter's joint prompt (``CentralizedPrompt``); its task oracle parses each
    joint text into one output per role (``CentralizedReward``: an unparsable text scores as empty outputs), then
    applies ``reward_processor`` (both in :mod:`comlrl_lightning.collaboration`). ``centralized_adapter``: see
    :func:`~comlrl_lightning.collaboration.resolve_adapter`.
    Other arguments as :class:`~comlrl_lightning.data.task.TaskDataModule`.
    """

    def __init__(self, *args: Any, centralized_adapter: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.external_transition is not None:
            raise ValueError("Centralized MAGRPO currently supports num_turns=1 only: external_transition must be "
                             f"None. Got {self.external_transition!r}.")
        self.adapter = resolve_adapter(centralized_adapter)
        self.num_roles = self.num_agents
        self.role_formatters = self.formatters
        # the user's reward (already bounded by reward_timeout) behind the parser; the processor after it
        self.joint_reward = CentralizedReward(self.adapter, self.oracle.reward_func, self.role_formatters)
        self.oracle = RewardOracle(self.joint_reward, self.oracle.reward_processor)
        self.formatters = [CentralizedPrompt(self.adapter, self.role_formatters)]

    def setup(self, stage: str) -> None:
        module = self.trainer.lightning_module if self.trainer is not None else None
        team = getattr(module, "team", None)
        if team is not None and team.num_agents != 1:
            raise ValueError(f"CentralizedTaskDataModule serves one joint learner (num_agents={self.num_roles} "
                             f"roles), but the module has {team.num_agents} agents. Use comlrl_lightning.modules."
                             "centralized_magrpo.CentralizedMAGRPOModule.")
