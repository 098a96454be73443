"""MAGRPOTrainer, MAREINFORCETrainer, MARLOOTrainer, MAReMaxTrainer: CoMLRL's constructors (docs/multiturn.md §8.1) as
thin facades over :class:`~comlrl_lightning.modules.magrpo.MAGRPOModule` + :class:`TaskDataModule` +
:class:`~comlrl_lightning.callbacks.TaskRewardEvaluation` + ``lightning.Trainer``.

The subclasses differ only in the default config class (``advantage_mode`` raw / rloo / max).
:class:`CentralizedMAGRPOTrainer` trains one joint policy that writes every role (CoMLRL 1.4.3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L

from comlrl_lightning.config.magrpo import (
    CentralizedMAGRPOConfig,
    MAGRPOConfig,
    MAREINFORCEConfig,
    MAReMaxConfig,
    MARLOOConfig,
)
from comlrl_lightning.data.task import TaskDataModule
from comlrl_lightning.modules.magrpo import MAGRPOModule, check_transition
from comlrl_lightning.multiturn.transitions import check_transition_signature
from comlrl_lightning.trainers.base import TeamTrainer

#: sampled joint responses per eval item in the facades' evaluation: the shipped configs' (configs/magrpo/*.yaml,
#: ``TaskRewardEvaluation.samples_per_item``), so that a facade and the YAML path report the same eval metrics
EVAL_SAMPLES_PER_ITEM = 8

__all__ = ["MAGRPOConfig", "MAGRPOTrainer", "CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer",
           "MAREINFORCEConfig", "MAREINFORCETrainer", "MAReMaxConfig", "MAReMaxTrainer", "MARLOOConfig",
           "MARLOOTrainer"]


class MAGRPOTrainer(TeamTrainer):
    """Multi-agent GRPO over (multi-turn) rollout trees.

    Args mirror CoMLRL's (docs/multiturn.md §8.1): ``agent_model`` or ``agents``, ``num_agents``, ``tokenizer``,
    ``model_config``, ``train_dataset``, ``eval_dataset``, ``reward_func``, ``reward_processor``,
    ``formatters``, ``external_transition``, ``args``; plus ``lora``, extra ``callbacks`` and
    ``trainer_kwargs`` for ``lightning.Trainer``. ``wandb_config`` (a dict with ``project``, ``entity``,
    ``name``/``run_name``, ``dir``, ``tags``) adds a ``WandbLogger`` unless ``trainer_kwargs`` sets a logger.

    The team size is ``args.num_agents`` (``len(agents)`` when only ``agents`` is given); an explicit
    ``num_agents`` must agree with it, as in every facade (upstream MAGRPO let it override the config).
    The evaluation samples ``EVAL_SAMPLES_PER_ITEM`` (8) joint responses per eval item, as the shipped configs, so
    the facade and the YAML path report the same ``eval/*`` numbers for the same job (``trainer.evaluation``).
    """

    config_cls: type[MAGRPOConfig] = MAGRPOConfig
    args_cls = MAGRPOConfig  # any advantage_mode may be set through args, as upstream
    algorithm_name = "MAGRPO"

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
        external_transition: Callable | None = None,
        wandb_config: dict | None = None,
        args: MAGRPOConfig | None = None,
        lora: dict | None = None,
        callbacks: Sequence[L.Callback] = (),
        trainer_kwargs: dict | None = None,
        eval_logger: Callable | None = None,
        eval_aggregator: Callable | None = None,
    ):
        self._init_args(args, agent_model, agents, reward_func, train_dataset, num_agents)
        check_transition(self.args, external_transition, self.algorithm_name)
        check_transition_signature(external_transition)
        self.module = MAGRPOModule(agent_model=agent_model, agents=agents, tokenizer=tokenizer,
                                   model_config=model_config, lora=lora, args=self.args)
        self.module.algorithm_name = self.algorithm_name
        self.datamodule = TaskDataModule(
            train_dataset=train_dataset, eval_dataset=eval_dataset, reward_func=reward_func,
            reward_processor=reward_processor, formatters=formatters, external_transition=external_transition,
            num_agents=self.args.num_agents, seed=self.args.seed,
        )
        self.evaluation = self._evaluation(bool(self.datamodule.eval_items), eval_logger, eval_aggregator)
        self.evaluation.samples_per_item = EVAL_SAMPLES_PER_ITEM
        self._init_trainer(self.args.num_train_epochs, [self.evaluation, *callbacks], wandb_config, trainer_kwargs)


class MAREINFORCETrainer(MAGRPOTrainer):
    """MAGRPO with ``advantage_mode="raw"`` by default."""

    config_cls = MAREINFORCEConfig
    algorithm_name = "MAREINFORCE"


class MARLOOTrainer(MAGRPOTrainer):
    """MAGRPO with ``advantage_mode="rloo"`` by default."""

    config_cls = MARLOOConfig
    algorithm_name = "MARLOO"


class MAReMaxTrainer(MAGRPOTrainer):
    """MAGRPO with ``advantage_mode="max"`` by default."""

    config_cls = MAReMaxConfig
    algorithm_name = "MAReMax"


class CentralizedMAGRPOTrainer(TeamTrainer):
    """One joint policy writes every role's output in one text, trained with MAGRPO on the task reward
    (CoMLRL 1.4.3's ``CentralizedMAGRPOTrainer``; single turn).

    ``num_agents``/``args.num_agents`` is the number of roles; ``agent_model`` or ``agents`` (a list of exactly
    one model) is the actor. ``formatters`` are the roles' own prompts, which ``centralized_adapter`` joins into
    one prompt (default: CoMLRL's tagged ``<agent_i>`` format, :class:`~comlrl_lightning.comparators.centralized.
    TaggedCentralizedComparatorAdapter`); the same adapter parses each joint completion into one output per role
    for ``reward_func`` (called exactly as for a decentralized team) and for evaluation (``eval_logger`` receives
    per-role outputs). Assembles :class:`~comlrl_lightning.modules.centralized_magrpo.CentralizedMAGRPOModule` +
    :class:`~comlrl_lightning.data.centralized.CentralizedTaskDataModule` + ``TaskRewardEvaluation`` +
    ``lightning.Trainer``; the other arguments as :class:`MAGRPOTrainer`.
    """

    config_cls = CentralizedMAGRPOConfig
    algorithm_name = "CentralizedMAGRPO"

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
        external_transition: Callable | None = None,
        wandb_config: dict | None = None,
        args: CentralizedMAGRPOConfig | None = None,
        lora: dict | None = None,
        callbacks: Sequence[L.Callback] = (),
        trainer_kwargs: dict | None = None,
        eval_logger: Callable | None = None,
        eval_aggregator: Callable | None = None,
        centralized_adapter: Any = None,
    ):
        from comlrl_lightning.collaboration import resolve_adapter
        from comlrl_lightning.data.centralized import CentralizedTaskDataModule
        from comlrl_lightning.modules.centralized_magrpo import CentralizedMAGRPOModule

        if args is not None and getattr(args, "collaboration_mode", None) != "centralized":
            raise ValueError("CentralizedMAGRPOTrainer requires centralized configuration: args must be a "
                             f"CentralizedMAGRPOConfig (collaboration_mode='centralized'); got "
                             f"{type(args).__name__}.")
        self._init_args(args, agent_model, agents, reward_func, train_dataset, num_agents)
        if external_transition is not None:
            raise ValueError("Centralized MAGRPO currently supports num_turns=1 only: external_transition must be "
                             f"None. Got {external_transition!r}.")
        adapter = resolve_adapter(centralized_adapter)
        self.module = CentralizedMAGRPOModule(agent_model=agent_model, agents=agents, tokenizer=tokenizer,
                                              model_config=model_config, lora=lora, args=self.args)
        self.datamodule = CentralizedTaskDataModule(
            train_dataset=train_dataset, eval_dataset=eval_dataset, reward_func=reward_func,
            reward_processor=reward_processor, formatters=formatters, num_agents=self.args.num_agents,
            seed=self.args.seed, centralized_adapter=adapter,
        )
        self.evaluation = self._evaluation(bool(self.datamodule.eval_items), eval_logger, eval_aggregator)
        self.evaluation.samples_per_item = EVAL_SAMPLES_PER_ITEM
        self._init_trainer(self.args.num_train_epochs, [self.evaluation, *callbacks], wandb_config, trainer_kwargs)
