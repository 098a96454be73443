"""MADPOTrainer: the facade CoMLRL users expect; it only assembles Trainer + module + data + callbacks.

Everything it does is reachable from a YAML config too (``comlrl-lightning fit --config
configs/madpo/tiny.yaml``).

Like CoMLRL's ``comlrl.trainers.preference``, this module also exposes the other preference trainers, their
configs, the reward model and the centralized-comparator adapter names (docs/coming-from-comlrl.md); they load
on first use, so importing this module does not import the iterative or MARLHF machinery.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L

from comlrl_lightning.callbacks import PreferenceCollection
from comlrl_lightning.config import MADPOConfig
from comlrl_lightning.data.preference import PreferenceDataModule
from comlrl_lightning.modules.madpo import MADPOModule
from comlrl_lightning.trainers.base import TeamTrainer

# CoMLRL's ``comlrl.trainers.preference`` exports (docs/coming-from-comlrl.md): name -> defining module
_REEXPORTS = {
    "MADPOConfig": "comlrl_lightning.config",
    "MADPOIterConfig": "comlrl_lightning.config",
    "MARLHFConfig": "comlrl_lightning.config",
    "MARLHFIterConfig": "comlrl_lightning.config",
    "MADPOIterTrainer": "comlrl_lightning.trainers.iterative",
    "MARLHFTrainer": "comlrl_lightning.trainers.marlhf",
    "MARLHFIterTrainer": "comlrl_lightning.trainers.marlhf",
    "JointRewardModel": "comlrl_lightning.modules.reward_model",
    "CentralizedComparatorAdapter": "comlrl_lightning.comparators.centralized",
    "CentralizedComparatorParseError": "comlrl_lightning.comparators.centralized",
    "TaggedCentralizedComparatorAdapter": "comlrl_lightning.comparators.centralized",
}
__all__ = ["MADPOTrainer", *_REEXPORTS]


def __getattr__(name: str) -> Any:
    import importlib

    if name not in _REEXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_REEXPORTS[name]), name)
    globals()[name] = value
    return value


class MADPOTrainer(TeamTrainer):
    """Offline MADPO: collect pairs once with the task reward, then ``num_train_epochs`` DPO epochs.

    Args mirror CoMLRL's (docs/preference.md §2.7): ``agent_model`` or ``agents``, ``tokenizer``, ``train_dataset``,
    ``eval_dataset``, ``reward_func``, ``reward_processor``, ``formatters``, ``args``; plus ``model_config``,
    ``lora``, extra ``callbacks``, ``trainer_kwargs`` for ``lightning.Trainer`` and CoMLRL's ``wandb_config``
    (a ``WandbLogger`` unless ``trainer_kwargs`` sets a logger), ``external_transition`` (accepted as in CoMLRL;
    unused, with a warning: preference trainers are single-turn), ``eval_logger`` and ``eval_aggregator``
    (custom evaluation metrics, logged as ``eval/<key>``). With ``args.collaboration_mode="centralized"`` one
    learner writes every role (``args.num_agents`` roles) in one joint text through ``centralized_comparator_adapter``
    (default: CoMLRL's tagged ``<agent_i>`` format); ``agents`` then holds at most one model.
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
        external_transition: Callable | None = None,
        eval_logger: Callable | None = None,
        eval_aggregator: Callable | None = None,
        centralized_comparator_adapter: Any = None,
    ):
        self._init_args(args, agent_model, agents, reward_func, train_dataset, num_agents)
        self._unused_transition(external_transition)
        learner_args, centralized = self.args, self.args.collaboration_mode == "centralized"
        if centralized:
            learner_args, formatters, reward_func = self._centralized(agents, tokenizer, formatters, reward_func,
                                                                      centralized_comparator_adapter)
        self.module = MADPOModule(agent_model=agent_model, agents=agents, tokenizer=tokenizer,
                                  model_config=model_config, lora=lora, args=learner_args)
        self.datamodule = PreferenceDataModule(
            train_dataset=train_dataset, eval_dataset=eval_dataset, reward_func=reward_func,
            reward_processor=reward_processor, formatters=formatters, num_agents=learner_args.num_agents,
            seed=self.args.seed, score_last_token=centralized,
        )
        self.collection = PreferenceCollection()
        self.evaluation = self._evaluation(bool(self.datamodule.eval_items), eval_logger, eval_aggregator)
        self._init_trainer(self.args.num_train_epochs, [self.collection, self.evaluation, *callbacks], wandb_config,
                           trainer_kwargs)
