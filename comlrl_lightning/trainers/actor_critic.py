"""IACTrainer and MAACTrainer: the facades CoMLRL users expect (docs/multiturn.md §8.1).

They only assemble ``lightning.Trainer`` + :class:`~comlrl_lightning.modules.actor_critic.ActorCriticModule` +
:class:`~comlrl_lightning.data.task.TaskDataModule` + task-reward evaluation. The same runs are reachable
from YAML (``comlrl-lightning fit --config configs/iac/tiny.yaml``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
from torch import nn

from comlrl_lightning.config import IACConfig, MAACConfig
from comlrl_lightning.data.task import TaskDataModule
from comlrl_lightning.modules.actor_critic import ActorCriticModule
from comlrl_lightning.multiturn.transitions import check_transition_signature
from comlrl_lightning.trainers.base import TeamTrainer

# CoMLRL's ``comlrl.trainers.actor_critic`` exports (docs/coming-from-comlrl.md); RolloutSample is internal here
__all__ = ["ActorCriticTrainerBase", "IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer"]


class _ActorCriticTrainer(TeamTrainer):
    config_cls: type = IACConfig
    algorithm_name = "AC"
    # CoMLRL's IAC/MAAC take no num_agents: N is always args.num_agents, and an agents list of another length
    # is an error (raised by the module), not a new team size.
    num_agents_from_agents = False

    def __init__(
        self,
        agent_model: str | None = None,
        critic_model: Any = None,
        tokenizer: Any = None,
        reward_func: Callable | None = None,
        reward_processor: Callable | None = None,
        formatters: Any = None,
        args: IACConfig | MAACConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        model_config: dict | None = None,
        wandb_config: dict | None = None,
        metrics_callback: Callable | None = None,
        external_transition: Callable | None = None,
        agents: Sequence[Any] | None = None,
        critics: Sequence[Any] | None = None,
        critic_model_name: str | None = None,
        lora: dict | None = None,
        callbacks: Sequence[L.Callback] = (),
        trainer_kwargs: dict | None = None,
        eval_logger: Callable | None = None,
        eval_aggregator: Callable | None = None,
    ):
        self._init_args(args, agent_model, agents, reward_func, train_dataset)
        n = self.args.num_agents
        if agents is None and isinstance(agent_model, nn.Module) and n > 1:
            raise ValueError(f"{self.algorithm_name} with num_agents={n} requires `agent_model` to be a pretrained "
                             "identifier string (loaded once per agent); pass model objects through `agents`.")
        if self.args.num_turns > 1 and external_transition is None:
            raise ValueError(f"Multi-turn {self.algorithm_name} requires an external_transition (num_turns="
                             f"{self.args.num_turns}); pass external_transition=..., or set num_turns=1.")
        check_transition_signature(external_transition)
        if agents is not None and isinstance(agent_model, nn.Module):
            agent_model = None
        self.module = ActorCriticModule(
            agent_model=agent_model, agents=agents, tokenizer=tokenizer, critic_model=critic_model, critics=critics,
            critic_model_name=critic_model_name, model_config=model_config, lora=lora, args=self.args,
            metrics_callback=metrics_callback,
        )
        self.datamodule = TaskDataModule(
            train_dataset=train_dataset, eval_dataset=eval_dataset, reward_func=reward_func,
            reward_processor=reward_processor, formatters=formatters, external_transition=external_transition,
            num_agents=n, seed=self.args.seed,
        )
        self.evaluation = self._evaluation(bool(self.datamodule.eval_items), eval_logger, eval_aggregator)
        extra = [self.evaluation] if self.datamodule.eval_items else []
        self._init_trainer(self.args.num_train_epochs, [*extra, *callbacks], wandb_config, trainer_kwargs)


class IACTrainer(_ActorCriticTrainer):
    """Independent actor-critic: one critic per agent (separate critic LMs, or value heads on the actors).

    Args follow CoMLRL (docs/multiturn.md §8.1): ``agent_model``, ``critic_model``, ``tokenizer``, ``reward_func``,
    ``reward_processor``, ``formatters``, ``args`` (:class:`~comlrl_lightning.config.IACConfig`),
    ``train_dataset``, ``eval_dataset``, ``model_config``, ``wandb_config``, ``metrics_callback``,
    ``external_transition``, ``agents``, ``critics``; plus ``critic_model_name``, ``lora``, extra ``callbacks``
    and ``trainer_kwargs`` for ``lightning.Trainer``. The critic defaults to the agents' source when it is a
    string.
    """

    config_cls = IACConfig
    algorithm_name = "IAC"


class MAACTrainer(_ActorCriticTrainer):
    """Multi-agent actor-critic with one centralised critic over the joint prompts (and joint action for Q).

    Same arguments as :class:`IACTrainer`, with ``args`` a :class:`~comlrl_lightning.config.MAACConfig` and
    exactly one critic (``critic_model``, ``critics=[one]``, or the agents' string source).
    """

    config_cls = MAACConfig
    algorithm_name = "MAAC"


ActorCriticTrainerBase = _ActorCriticTrainer
"""CoMLRL's name of the shared IAC/MAAC trainer base."""
