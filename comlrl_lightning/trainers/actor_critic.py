"""IACTrainer and MAACTrainer: the facades CoMLRL users expect (spec multiturn.md §8.1).

They only assemble ``lightning.Trainer`` + :class:`~comlrl_lightning.modules.actor_critic.ActorCriticModule` +
:class:`~comlrl_lightning.data.tasks_dm.TaskDataModule` + task-reward evaluation. The same runs are reachable
from YAML (``comlrl-lightning fit --config configs/iac/tiny.yaml``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
from torch import nn

from comlrl_lightning.callbacks import TaskRewardEvaluation
from comlrl_lightning.config import IACConfig, MAACConfig
from comlrl_lightning.data.tasks_dm import TaskDataModule
from comlrl_lightning.modules.actor_critic import ActorCriticModule
from comlrl_lightning.trainers.common import check_facade_inputs, trainer_kwargs_for


class _ActorCriticTrainer:
    _config_cls: type = IACConfig
    _method = "AC"

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
    ):
        self.args = args if args is not None else self._config_cls()
        if not isinstance(self.args, self._config_cls):
            raise TypeError(f"{type(self).__name__} needs args of type {self._config_cls.__name__}; got "
                            f"{type(self.args).__name__}.")
        n = self.args.num_agents
        if agents is None and isinstance(agent_model, nn.Module) and n > 1:
            raise ValueError(f"{self._method} with num_agents={n} requires `agent_model` to be a pretrained "
                             "identifier string (loaded once per agent); pass model objects through `agents`.")
        check_facade_inputs(agent_model, agents, reward_func, train_dataset)
        if self.args.num_turns > 1 and external_transition is None:
            raise ValueError(f"Multi-turn {self._method} requires an external_transition (num_turns="
                             f"{self.args.num_turns}); pass external_transition=..., or set num_turns=1.")
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
        self.evaluation = TaskRewardEvaluation()
        kwargs = trainer_kwargs_for(self.args.num_train_epochs, self.args, self._method, wandb_config,
                                    trainer_kwargs)
        extra = [self.evaluation] if self.datamodule.eval_items else []
        self.trainer = L.Trainer(callbacks=[*extra, *callbacks], **kwargs)

    @property
    def team(self):
        return self.module.team

    @property
    def env_step(self) -> int:
        return self.module.env_step

    def train(self, ckpt_path: str | None = None) -> dict:
        """Roll out and train; returns the final callback metrics as floats."""
        self.trainer.fit(self.module, datamodule=self.datamodule, ckpt_path=ckpt_path)
        return {k: float(v) for k, v in self.trainer.callback_metrics.items()}

    def save_model(self, output_dir: str) -> list[str]:
        """``output_dir/agent_{i}/`` (+ critic / value head) per agent; MAAC also ``output_dir/critic/``."""
        return self.module.save_agents(output_dir)


class IACTrainer(_ActorCriticTrainer):
    """Independent actor-critic: one critic per agent (separate critic LMs, or value heads on the actors).

    Args follow CoMLRL (§8.1): ``agent_model``, ``critic_model``, ``tokenizer``, ``reward_func``,
    ``reward_processor``, ``formatters``, ``args`` (:class:`~comlrl_lightning.config.IACConfig`),
    ``train_dataset``, ``eval_dataset``, ``model_config``, ``wandb_config``, ``metrics_callback``,
    ``external_transition``, ``agents``, ``critics``; plus ``critic_model_name``, ``lora``, extra ``callbacks``
    and ``trainer_kwargs`` for ``lightning.Trainer``. The critic defaults to the agents' source when it is a
    string.
    """

    _config_cls = IACConfig
    _method = "IAC"


class MAACTrainer(_ActorCriticTrainer):
    """Multi-agent actor-critic with one centralised critic over the joint prompts (and joint action for Q).

    Same arguments as :class:`IACTrainer`, with ``args`` a :class:`~comlrl_lightning.config.MAACConfig` and
    exactly one critic (``critic_model``, ``critics=[one]``, or the agents' string source).
    """

    _config_cls = MAACConfig
    _method = "MAAC"
