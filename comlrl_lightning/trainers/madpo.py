"""MADPO's facades: :class:`MADPOTrainer` (offline: collect pairs once with the task reward, then DPO epochs) and
:class:`MADPOIterTrainer` (rounds of collect current-vs-comparator pairs → replay → DPO epochs, as Lightning epochs).

They only assemble Trainer + module + data + callbacks; everything they do is reachable from a YAML config too
(``comlrl-lightning fit --config configs/madpo/tiny.yaml`` or ``configs/madpo/iterative_tiny.yaml``).

MADPOIter: with ``E = num_train_epochs`` and ``T = num_iterations`` the Trainer runs ``T * E`` epochs with
``reload_dataloaders_every_n_epochs=1``; the round-boundary callbacks (HistoryCheckpoint when snapshots are
on, ComparatorRefresh, IterativePreferenceCollection, ReplaySelection) prepare each round's pairs before its
first epoch. ``trainer.global_step`` counts every optimizer step of every agent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L

from comlrl_lightning.callbacks import (
    ComparatorRefresh,
    HistoryCheckpoint,
    IterativePreferenceCollection,
    PreferenceCollection,
    ReplaySelection,
    RewardDistributionLogger,
)
from comlrl_lightning.comparators.local import build_comparator
from comlrl_lightning.config import MADPOConfig, MADPOIterConfig
from comlrl_lightning.data.madpo import IterativePreferenceDataModule, PreferenceDataModule
from comlrl_lightning.distributions import resolve_reward_range
from comlrl_lightning.modules.madpo import MADPOModule
from comlrl_lightning.trainers.base import TeamTrainer

__all__ = ["MADPOIterTrainer", "MADPOTrainer", "round_callbacks"]

#: sampled joint responses per eval item in the facades' evaluation: the shipped configs'
#: (``TaskRewardEvaluation.samples_per_item`` in configs/madpo/tiny.yaml and configs/madpo/iterative_tiny.yaml),
#: so that a facade and the YAML path report the same eval metrics
EVAL_SAMPLES_PER_ITEM = 8
ITER_EVAL_SAMPLES_PER_ITEM = 4


class MADPOTrainer(TeamTrainer):
    """Offline MADPO: collect pairs once with the task reward, then ``num_train_epochs`` DPO epochs.

    Args mirror CoMLRL's (docs/preference.md §2.7): ``agent_model`` or ``agents``, ``tokenizer``, ``train_dataset``,
    ``eval_dataset``, ``reward_func``, ``reward_processor``, ``formatters``, ``args``; plus ``model_config``,
    ``lora``, extra ``callbacks``, ``trainer_kwargs`` for ``lightning.Trainer`` and CoMLRL's ``wandb_config``
    (a ``WandbLogger`` unless ``trainer_kwargs`` sets a logger), ``external_transition`` (accepted as in CoMLRL;
    unused, with a warning: preference trainers are single-turn), ``eval_logger`` and ``eval_aggregator``
    (custom evaluation metrics, logged as ``eval/<key>``). With ``args.collaboration_mode="centralized"`` one
    learner writes every role (``args.num_agents`` roles) in one joint text through ``centralized_comparator_adapter``
    (default: CoMLRL's tagged ``<agent_i>`` format); ``agents`` then holds at most one model. The evaluation
    samples ``EVAL_SAMPLES_PER_ITEM`` (8) joint responses per eval item, as configs/madpo/tiny.yaml
    (``trainer.evaluation.samples_per_item`` changes it).
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
        self.evaluation.samples_per_item = EVAL_SAMPLES_PER_ITEM
        self._init_trainer(self.args.num_train_epochs, [self.collection, self.evaluation, *callbacks], wandb_config,
                           trainer_kwargs)


def round_callbacks(args: MADPOIterConfig, comparator: Any = None) -> list[L.Callback]:
    """The round-boundary callbacks for ``args``, in the order they must run. The comparator belongs to the
    data module; ``comparator`` is only kept for existing callers (the callbacks hand it to the data module)."""
    cbs: list[L.Callback] = []
    if args.policy_checkpoint_dir is not None or args.comparator_policy == "history":
        cbs.append(HistoryCheckpoint())
    cbs += [ComparatorRefresh(comparator), IterativePreferenceCollection(comparator), ReplaySelection()]
    if args.log_reward_distribution:
        cbs.append(RewardDistributionLogger())
    return cbs


class MADPOIterTrainer(TeamTrainer):
    """Iterative MADPO (docs/preference.md §10): ``num_iterations`` rounds, each collecting pairs against a comparator.

    Args mirror :class:`~comlrl_lightning.trainers.madpo.MADPOTrainer`; ``args`` is a
    :class:`~comlrl_lightning.config.MADPOIterConfig`. ``comparator`` overrides the source built from
    ``args.comparator_policy``; ``evaluation=False`` drops the task-reward evaluation callback;
    ``centralized_comparator_adapter`` (an object with ``build_prompt`` and ``parse_completion``) replaces the
    tagged format of ``comparator_generation_mode='centralized'``. With ``args.collaboration_mode="centralized"``
    one learner writes every role in one joint text (as :class:`~comlrl_lightning.trainers.madpo.MADPOTrainer`)
    and its comparator samples the same joint prompt, its completions kept as unparsed joint texts. The evaluation
    samples ``ITER_EVAL_SAMPLES_PER_ITEM`` (4) joint responses per eval item, as configs/madpo/iterative_tiny.yaml.
    """

    config_cls = MADPOIterConfig
    algorithm_name = "MADPOIter"

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
        args: MADPOIterConfig | None = None,
        lora: dict | None = None,
        comparator: Any = None,
        evaluation: bool = True,
        centralized_comparator_adapter: Any = None,
        callbacks: Sequence[L.Callback] = (),
        trainer_kwargs: dict | None = None,
        wandb_config: dict | None = None,
        external_transition: Callable | None = None,
        eval_logger: Callable | None = None,
        eval_aggregator: Callable | None = None,
    ):
        self._init_args(args, agent_model, agents, reward_func, train_dataset, num_agents)
        self._unused_transition(external_transition)
        if self.args.log_reward_distribution:
            resolve_reward_range(reward_func)  # checked at construction, as upstream
        learner_args, centralized = self.args, self.args.collaboration_mode == "centralized"
        if centralized:  # the adapter builds the joint prompt; the comparator samples the same prompt
            learner_args, formatters, reward_func = self._centralized(agents, tokenizer, formatters, reward_func,
                                                                      centralized_comparator_adapter)
        self.module = MADPOModule(agent_model=agent_model, agents=agents, tokenizer=tokenizer,
                                  model_config=model_config, lora=lora, args=learner_args)
        self.comparator = comparator if comparator is not None else build_comparator(
            learner_args, model_config, adapter=centralized_comparator_adapter)
        self.datamodule = IterativePreferenceDataModule(
            train_dataset=train_dataset, eval_dataset=eval_dataset, reward_func=reward_func,
            reward_processor=reward_processor, formatters=formatters, num_agents=learner_args.num_agents,
            seed=self.args.seed, comparator=self.comparator, score_last_token=centralized,
        )
        self.round_callbacks = round_callbacks(learner_args)
        self.evaluation = (self._evaluation(bool(self.datamodule.eval_items), eval_logger, eval_aggregator)
                           if evaluation else None)
        if self.evaluation is not None:
            self.evaluation.samples_per_item = ITER_EVAL_SAMPLES_PER_ITEM
        extra = [self.evaluation] if self.evaluation is not None else []
        self._init_trainer(self.args.num_iterations * self.args.num_train_epochs,
                           [*self.round_callbacks, *extra, *callbacks], wandb_config, trainer_kwargs,
                           reload_dataloaders_every_n_epochs=1)

    @property
    def collection(self) -> IterativePreferenceCollection:
        return next(cb for cb in self.round_callbacks if isinstance(cb, IterativePreferenceCollection))
