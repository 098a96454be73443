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
from comlrl_lightning.trainers.common import check_facade_inputs, sync_num_agents, trainer_kwargs_for


class MADPOTrainer:
    """Offline MADPO: collect pairs once with the task reward, then ``num_train_epochs`` DPO epochs.

    Args mirror CoMLRL's (spec §2.7): ``agent_model`` or ``agents``, ``tokenizer``, ``train_dataset``,
    ``eval_dataset``, ``reward_func``, ``reward_processor``, ``formatters``, ``args``; plus ``model_config``,
    ``lora``, extra ``callbacks``, ``trainer_kwargs`` for ``lightning.Trainer`` and CoMLRL's ``wandb_config``
    (a ``WandbLogger`` unless ``trainer_kwargs`` sets a logger).
    """

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
        check_facade_inputs(agent_model, agents, reward_func, train_dataset)
        self.args = args if args is not None else MADPOConfig()
        sync_num_agents(self.args, agents, num_agents)
        self.module = MADPOModule(agent_model=agent_model, agents=agents, tokenizer=tokenizer,
                                  model_config=model_config, lora=lora, args=self.args)
        self.datamodule = PreferenceDataModule(
            train_dataset=train_dataset, eval_dataset=eval_dataset, reward_func=reward_func,
            reward_processor=reward_processor, formatters=formatters, num_agents=self.args.num_agents,
            seed=self.args.seed,
        )
        self.collection = PreferenceCollection()
        self.evaluation = TaskRewardEvaluation()
        kwargs = trainer_kwargs_for(self.args.num_train_epochs, self.args, "MADPO", wandb_config, trainer_kwargs)
        self.trainer = L.Trainer(callbacks=[self.collection, self.evaluation, *callbacks], **kwargs)

    @property
    def team(self):
        return self.module.team

    def train(self, ckpt_path: str | None = None) -> dict:
        """Collect pairs and train; returns the final callback metrics as floats."""
        self.trainer.fit(self.module, datamodule=self.datamodule, ckpt_path=ckpt_path)
        return {k: float(v) for k, v in self.trainer.callback_metrics.items()}

    def save_model(self, output_dir: str) -> list[str]:
        """Write ``output_dir/agent_{i}/`` for each agent (model + tokenizer, or the LoRA adapter)."""
        return self.module.save_agents(output_dir)
