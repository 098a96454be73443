"""MADPOTrainer: the facade CoMLRL users expect; it only assembles Trainer + module + data + callbacks.

Everything it does is reachable from a YAML config too (``comlrl-lightning fit --config
configs/madpo/tiny.yaml``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L

from comlrl_lightning.callbacks import PreferenceCollection, TaskRewardEvaluation
from comlrl_lightning.config import MADPOConfig
from comlrl_lightning.data.preference import PreferenceDataModule
from comlrl_lightning.modules.madpo import MADPOModule
from comlrl_lightning.trainers.base import TeamTrainer


class MADPOTrainer(TeamTrainer):
    """Offline MADPO: collect pairs once with the task reward, then ``num_train_epochs`` DPO epochs.

    Args mirror CoMLRL's (docs/preference.md §2.7): ``agent_model`` or ``agents``, ``tokenizer``, ``train_dataset``,
    ``eval_dataset``, ``reward_func``, ``reward_processor``, ``formatters``, ``args``; plus ``model_config``,
    ``lora``, extra ``callbacks``, ``trainer_kwargs`` for ``lightning.Trainer`` and CoMLRL's ``wandb_config``
    (a ``WandbLogger`` unless ``trainer_kwargs`` sets a logger).
    """

    config_cls = MADPOConfig
    algorithm_name = "MADPO"

    def __init__(
        self,
        agent_model: str | None = None,
        agents: Sequence[Any] | None = None,
        num_agents: int | None = None,
        tokenizer: Any = None,
        model_config: dict | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        reward_func: Callable | None = None,
        reward_processor: Callable | None = None,
        formatters: Any = None,
        args: MADPOConfig | None = None,
        lora: dict | None = None,
        callbacks: Sequence[L.Callback] = (),
        trainer_kwargs: dict | None = None,
        wandb_config: dict | None = None,
    ):
        self._init_args(args, agent_model, agents, reward_func, train_dataset, num_agents)
        self.module = MADPOModule(agent_model=agent_model, agents=agents, tokenizer=tokenizer,
                                  model_config=model_config, lora=lora, args=self.args)
        self.datamodule = PreferenceDataModule(
            train_dataset=train_dataset, eval_dataset=eval_dataset, reward_func=reward_func,
            reward_processor=reward_processor, formatters=formatters, num_agents=self.args.num_agents,
            seed=self.args.seed,
        )
        self.collection = PreferenceCollection()
        self.evaluation = TaskRewardEvaluation()
        self._init_trainer(self.args.num_train_epochs, [self.collection, self.evaluation, *callbacks], wandb_config,
                           trainer_kwargs)
