"""MARLHFTrainer and MARLHFIterTrainer: reward model from preferences, then RL on the learned reward
(docs/preference.md §10).

Thin facades that assemble ``lightning.Trainer`` + an RL module
(:func:`~comlrl_lightning.modules.marlhf.build_marlhf_module`: the MAGRPO family or IAC/MAAC, by
``rl_algorithm``) + a data module + callbacks. Everything is reachable from YAML too
(``configs/marlhf/tiny.yaml``, ``configs/marlhf/iterative_tiny.yaml``).

* **MARLHF**: one ``fit``. :class:`~comlrl_lightning.callbacks.LearnedRewardFit` collects the pairs with the
  task reward at fit start and fits the reward model; then ``num_train_epochs`` RL epochs over the task
  items use the learned reward (``module.train_oracle``).
* **MARLHFIter**: one ``fit`` of ``num_iterations * num_train_epochs`` epochs (rounds are groups of
  epochs). At each round boundary the round callbacks collect current-vs-comparator pairs, select the
  replay, and :class:`~comlrl_lightning.callbacks.IterativeRewardModelFit` fits a freshly built reward
  model on them and swaps the RL reward.

Evaluation (:class:`~comlrl_lightning.callbacks.TaskRewardEvaluation`) samples the current policies and
scores them with the **task** reward only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L

from comlrl_lightning.callbacks import (
    ComparatorRefresh,
    HistoryCheckpoint,
    IterativeRewardModelFit,
    LearnedRewardFit,
    ReplaySelection,
    RewardDistributionLogger,
    ScoredPreferenceCollection,
)
from comlrl_lightning.config import MARLHFConfig, MARLHFIterConfig
from comlrl_lightning.modules.marlhf import build_marlhf_module, default_reward_source
from comlrl_lightning.trainers.base import TeamTrainer

#: sampled joint responses per eval item in the facades' evaluation: the shipped configs'
#: (``TaskRewardEvaluation.samples_per_item`` in configs/marlhf/tiny.yaml and configs/marlhf/iterative_tiny.yaml),
#: so that a facade and the YAML path report the same eval metrics
EVAL_SAMPLES_PER_ITEM = 4


def _check_reward_source(agent_model: Any, agents: Any, args: MARLHFConfig, reward_model: Any) -> None:
    if reward_model is None and args.reward_model_name is None and default_reward_source(agent_model, agents) is None:
        raise ValueError(
            "reward_model_name must be provided when agent models are objects: the reward backbone is loaded from "
            "args.reward_model_name, else from the agents' model name, and these agents have none. Set "
            "args.reward_model_name='<hub id or folder>' (e.g. 'embedded:tiny'), or pass "
            "reward_model=JointRewardModel(model_object, tokenizer)."
        )


class MARLHFTrainer(TeamTrainer):
    """Offline MARLHF: pairs (task reward) → JointRewardModel → RL with the learned reward (docs/preference.md §10).

    Args mirror CoMLRL's (docs/preference.md §2.7): ``agent_model`` or ``agents``, ``num_agents``, ``tokenizer``,
    ``model_config``, ``train_dataset``, ``eval_dataset``, ``reward_func``, ``reward_processor``,
    ``formatters``, ``args`` (:class:`~comlrl_lightning.config.MARLHFConfig`); keyword-only
    ``metrics_callback``, ``critic_model`` and ``critics`` (maac/iac only). Ours: ``reward_model`` (a
    JointRewardModel template, e.g. over a model object; a fresh copy is trained), ``reward_val_fraction``
    (default 0.1: hold out whole prompt sets of the pairs, keep the reward model's best epoch on them and log its
    held-out accuracy, ``reward_model/val_accuracy``; 0 = train on every pair), ``centralized_comparator_adapter`` (the
    joint-text format of ``collaboration_mode="centralized"``), ``lora``, ``evaluation``, extra
    ``callbacks`` and ``trainer_kwargs``. With ``args.collaboration_mode="centralized"`` one learner writes every
    role in one joint text (as :class:`~comlrl_lightning.trainers.madpo.MADPOTrainer`): the reward model
    reads the raw joint text and the RL stage trains that one learner (``learner_args``: ``num_agents=1``).
    """

    config_cls: type[MARLHFConfig] = MARLHFConfig
    algorithm_name = "MARLHF"

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
        args: MARLHFConfig | None = None,
        *,
        metrics_callback: Callable | None = None,
        critic_model: Any = None,
        critics: Sequence[Any] | None = None,
        reward_model: Any = None,
        reward_val_fraction: float = 0.1,
        lora: dict | None = None,
        evaluation: bool = True,
        callbacks: Sequence[L.Callback] = (),
        trainer_kwargs: dict | None = None,
        wandb_config: dict | None = None,
        external_transition: Callable | None = None,
        eval_logger: Callable | None = None,
        eval_aggregator: Callable | None = None,
        centralized_comparator_adapter: Any = None,
    ):
        self._adapter = centralized_comparator_adapter
        self._init_args(args, agent_model, agents, reward_func, train_dataset, num_agents)
        self._unused_transition(external_transition)
        self._check_reward_distribution(reward_func)
        _check_reward_source(agent_model, agents, self.args, reward_model)
        self.learner_args = self.args
        if self.args.collaboration_mode == "centralized":  # one learner; reward-model inputs hold the joint text
            self.learner_args, formatters, reward_func = self._centralized(
                agents, tokenizer, formatters, reward_func, self._adapter)
        ac = {"critic_model": critic_model, "critics": critics, "metrics_callback": metrics_callback}
        self.module = build_marlhf_module(
            self.learner_args, agent_model=agent_model if agents is None else None, agents=agents,
            tokenizer=tokenizer, model_config=model_config, lora=lora, **{k: v for k, v in ac.items() if v is not None})
        self.datamodule = self._datamodule(train_dataset, eval_dataset, reward_func, reward_processor, formatters)
        self.round_callbacks = self._round_callbacks(reward_model, reward_val_fraction)
        self.evaluation = (self._evaluation(bool(self.datamodule.eval_items), eval_logger, eval_aggregator)
                           if evaluation else None)
        if self.evaluation is not None:
            self.evaluation.samples_per_item = EVAL_SAMPLES_PER_ITEM
        extra = [self.evaluation] if self.evaluation is not None and self.datamodule.eval_items else []
        self._init_trainer(self._max_epochs(), [*self.round_callbacks, *extra, *callbacks], wandb_config,
                           trainer_kwargs, **self._forced_trainer_kwargs())

    # --- the parts that differ between MARLHF and MARLHFIter ---------------------------------------------
    def _check_reward_distribution(self, reward_func: Any) -> None:
        """MARLHF has no rounds, so no reward distributions (MARLHFIter overrides this)."""

    def _datamodule(self, train_dataset, eval_dataset, reward_func, reward_processor, formatters):
        from comlrl_lightning.data.task import TaskDataModule

        return TaskDataModule(train_dataset=train_dataset, eval_dataset=eval_dataset, reward_func=reward_func,
                              reward_processor=reward_processor, formatters=formatters,
                              num_agents=self.learner_args.num_agents, seed=self.args.seed)

    def _round_callbacks(self, reward_model: Any, val_fraction: float) -> list[L.Callback]:
        self.reward_fit = LearnedRewardFit(reward_model, val_fraction=val_fraction)
        return [self.reward_fit]

    def _max_epochs(self) -> int:
        return self.args.num_train_epochs

    def _forced_trainer_kwargs(self) -> dict[str, Any]:
        return {}

    @property
    def reward_model(self):
        """The fitted JointRewardModel in use (None before training or when no pairs were collected)."""
        return self.reward_fit.current


class MARLHFIterTrainer(MARLHFTrainer):
    """Iterative MARLHF (docs/preference.md §10): ``num_iterations`` rounds of current-vs-comparator pairs → a freshly
    initialised reward model fitted on the round's (replay-selected) pairs → ``num_train_epochs`` RL epochs.

    Args as :class:`MARLHFTrainer` with ``args`` a :class:`~comlrl_lightning.config.MARLHFIterConfig`,
    plus ``comparator`` (overrides the source built from ``args.comparator_policy``) and
    ``centralized_comparator_adapter``. ``preference_scoring_reward="reward_model"`` scores round t ≥ 1's
    comparisons with round t−1's reward model (round 0: the task reward).
    """

    config_cls = MARLHFIterConfig
    algorithm_name = "MARLHFIter"

    def __init__(self, *args: Any, comparator: Any = None, centralized_comparator_adapter: Any = None,
                 **kwargs: Any):
        self._comparator_arg = comparator
        super().__init__(*args, centralized_comparator_adapter=centralized_comparator_adapter, **kwargs)

    def _datamodule(self, train_dataset, eval_dataset, reward_func, reward_processor, formatters):
        from comlrl_lightning.comparators.local import build_comparator
        from comlrl_lightning.data.marlhf import MARLHFIterDataModule

        self.comparator = self._comparator_arg if self._comparator_arg is not None else build_comparator(
            self.learner_args, self.module.hparams.get("model_config"), adapter=self._adapter)
        return MARLHFIterDataModule(train_dataset=train_dataset, eval_dataset=eval_dataset, reward_func=reward_func,
                                    reward_processor=reward_processor, formatters=formatters,
                                    num_agents=self.learner_args.num_agents, seed=self.args.seed,
                                    comparator=self.comparator)

    def _round_callbacks(self, reward_model: Any, val_fraction: float) -> list[L.Callback]:
        args = self.args
        self.reward_fit = IterativeRewardModelFit(reward_model, val_fraction=val_fraction)
        self.collection = ScoredPreferenceCollection()
        cbs: list[L.Callback] = []
        if args.policy_checkpoint_dir is not None or args.comparator_policy == "history":
            cbs.append(HistoryCheckpoint())
        extra: list[L.Callback] = [RewardDistributionLogger()] if args.log_reward_distribution else []
        return [*cbs, ComparatorRefresh(), self.collection, ReplaySelection(), *extra, self.reward_fit]

    def _check_reward_distribution(self, reward_func: Any) -> None:
        if self.args.log_reward_distribution:
            from comlrl_lightning.distributions import resolve_reward_range

            resolve_reward_range(reward_func)  # checked at construction, as upstream and MADPOIter

    def _max_epochs(self) -> int:
        return self.args.num_iterations * self.args.num_train_epochs

    def _forced_trainer_kwargs(self) -> dict[str, Any]:
        return {"reload_dataloaders_every_n_epochs": 1}
