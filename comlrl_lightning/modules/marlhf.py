"""MARLHF's RL stage as LightningModules: the RL backends trained on a learned reward (docs/preference.md §8.5, §9).

* :class:`MARLHFModule`: the MAGRPO family (``rl_algorithm`` magrpo / mareinforce / marloo / maremax; the
  config has already forced ``advantage_mode``), i.e. :class:`~comlrl_lightning.modules.magrpo.MAGRPOModule`
  driven by a :class:`~comlrl_lightning.config.MARLHFConfig`.
* :class:`MARLHFActorCriticModule`: ``rl_algorithm`` iac / maac, i.e.
  :class:`~comlrl_lightning.modules.actor_critic.ActorCriticModule` with the IAC/MAAC config MARLHF forwards
  (docs/preference.md §9.2). ``module.args`` reads the backend's options first, then MARLHF's (so the round callbacks
  find ``preference_num_candidates`` & co.).

Both train only on ``train_oracle`` (the learned reward), which a reward-model callback
(:class:`~comlrl_lightning.callbacks.LearnedRewardFit` or
:class:`~comlrl_lightning.callbacks.IterativeRewardModelFit`) sets: while it is None (no pairs were
collected, or a round without training pairs) a training step rolls nothing out and updates nothing,
so the task reward never leaks into RL. Evaluation (TaskRewardEvaluation) always uses the task reward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info

from comlrl_lightning.config import MAGRPO_FAMILY, MARLHFConfig, MARLHFIterConfig
from comlrl_lightning.modules.actor_critic import ActorCriticModule
from comlrl_lightning.modules.magrpo import MAGRPOModule
from comlrl_lightning.tiny import TINY_MODEL_NAME

ALGORITHM_NAMES = {"magrpo": "MAGRPO", "mareinforce": "MAREINFORCE", "maremax": "MAReMax", "marloo": "MARLOO",
                   "maac": "MAAC", "iac": "IAC"}


def default_reward_source(agent_model: Any, agents: Sequence[Any] | None) -> str | None:
    """The agents' model name when it is one string (the reward model's fallback source, docs/preference.md §8.2), else
    None. Model objects count by the name they were loaded from, when it can be loaded again
    (:func:`~comlrl_lightning.agents.loadable_name_of`; CoMLRL infers the name of model objects too)."""
    from comlrl_lightning.agents import loadable_name_of

    def name(a: Any) -> str | None:
        return a if isinstance(a, str) else loadable_name_of(a)

    if agents is None:
        return name(agent_model) if agent_model is not None else None
    names = [name(a) for a in agents]
    if names and None not in names and len(set(names)) == 1:
        return names[0]
    return None


def _check_reward_callback(module: Any) -> None:
    trainer = module._trainer
    if trainer is None:
        return
    if not any(getattr(cb, "sets_train_oracle", False) for cb in trainer.callbacks):
        raise ValueError(
            f"{type(module).__name__} trains on a learned reward only, set by a reward-model callback; none is "
            "configured. Add comlrl_lightning.callbacks.LearnedRewardFit (offline MARLHF) or "
            "IterativeRewardModelFit (MARLHFIter) to the Trainer's callbacks, or use MARLHFTrainer."
        )


class _SkipWithoutLearnedReward:
    """Mixin of the RL-stage modules: names the algorithm, keeps the reward model's default source, requires a
    reward-model callback, and skips RL steps while no learned reward exists (saying so once)."""

    train_oracle: Any

    def _init_stage(self, args: MARLHFConfig, agent_model: Any, agents: Sequence[Any] | None,
                    model_config: dict | None) -> None:
        self.algorithm_name = f"MARLHF/{ALGORITHM_NAMES[args.rl_algorithm]}"
        self.reward_source = default_reward_source(agent_model, agents)
        self.model_config = model_config
        self._said_skip = False  # the "no learned reward yet" message is said once

    def setup(self, stage: str) -> None:
        super().setup(stage)
        _check_reward_callback(self)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        if self._no_learned_reward():
            return None
        return super().training_step(batch, batch_idx)

    def _no_learned_reward(self) -> bool:
        if self.train_oracle is not None:
            return False
        if not self._said_skip:
            rank_zero_info("MARLHF: no learned reward model is active (no training pairs); RL steps are skipped "
                           "until one is fitted.")
            self._said_skip = True
        return True


class MARLHFModule(_SkipWithoutLearnedReward, MAGRPOModule):
    """The MAGRPO-family RL stage of MARLHF (``rl_algorithm`` magrpo, mareinforce, maremax or marloo).

    Args as :class:`~comlrl_lightning.modules.magrpo.MAGRPOModule`, with ``args`` a
    :class:`~comlrl_lightning.config.MARLHFConfig` or
    :class:`~comlrl_lightning.config.MARLHFIterConfig`. The reward-model callback needs the agents'
    source for its default backbone: ``reward_source`` is the agents' model name when it is a string.
    """

    def __init__(self, agent_model: str | None = TINY_MODEL_NAME, agents: Sequence[Any] | None = None,
                 tokenizer: Any = None, model_config: dict | None = None, lora: dict | None = None,
                 args: MARLHFConfig | MARLHFIterConfig | None = None, optimizer: OptimizerCallable | None = None,
                 lr_scheduler: LRSchedulerCallable | None = None):
        args = args if args is not None else MARLHFConfig()
        if not isinstance(args, MARLHFConfig):
            raise TypeError(f"MARLHFModule needs a MARLHFConfig or MARLHFIterConfig; got {type(args).__name__}.")
        if args.rl_algorithm not in MAGRPO_FAMILY:
            raise ValueError(
                f"MARLHFModule runs the MAGRPO family (rl_algorithm in {', '.join(MAGRPO_FAMILY)}); got "
                f"rl_algorithm={args.rl_algorithm!r}. Use MARLHFActorCriticModule for maac/iac."
            )
        super().__init__(agent_model=agent_model, agents=agents, tokenizer=tokenizer, model_config=model_config,
                         lora=lora, args=args, optimizer=optimizer, lr_scheduler=lr_scheduler)
        self._init_stage(args, agent_model, agents, model_config)


class _ArgsView:
    """Read-only view of two configs: the RL backend's options first, then MARLHF's."""

    def __init__(self, backend: Any, marlhf: MARLHFConfig):
        object.__setattr__(self, "backend", backend)
        object.__setattr__(self, "marlhf", marlhf)

    def __getattr__(self, name: str) -> Any:
        backend = object.__getattribute__(self, "backend")
        if hasattr(backend, name):
            return getattr(backend, name)
        return getattr(object.__getattribute__(self, "marlhf"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("MARLHF actor-critic args are read-only; change the MARLHFConfig before building.")

    def to_dict(self) -> dict[str, Any]:
        return {**self.marlhf.to_dict(), **self.backend.to_dict()}


class MARLHFActorCriticModule(_SkipWithoutLearnedReward, ActorCriticModule):
    """The actor-critic RL stage of MARLHF (``rl_algorithm`` iac or maac; docs/preference.md §9.2).

    Args as :class:`~comlrl_lightning.modules.actor_critic.ActorCriticModule`, with ``args`` a MARLHF config;
    the IAC/MAAC config is derived from it (:meth:`MARLHFConfig.actor_critic_config`). Critic sources:
    ``critics`` → ``critic_model`` → ``args.critic_model_name`` → the agents' model name (IAC with
    ``use_separate_critic=False`` needs none).
    """

    def __init__(self, agent_model: str | None = TINY_MODEL_NAME, agents: Sequence[Any] | None = None,
                 tokenizer: Any = None, critic_model: Any = None, critics: Sequence[Any] | None = None,
                 model_config: dict | None = None, lora: dict | None = None,
                 args: MARLHFConfig | MARLHFIterConfig | None = None, metrics_callback: Callable | str | None = None,
                 optimizer: OptimizerCallable | None = None, lr_scheduler: LRSchedulerCallable | None = None):
        args = args if args is not None else MARLHFConfig(rl_algorithm="iac", num_generations=1)
        if not isinstance(args, MARLHFConfig):
            raise TypeError(f"MARLHFActorCriticModule needs a MARLHFConfig; got {type(args).__name__}.")
        if not args.is_actor_critic:
            raise ValueError(f"MARLHFActorCriticModule runs rl_algorithm 'maac' or 'iac'; got {args.rl_algorithm!r}. "
                             "Use MARLHFModule for the MAGRPO family.")
        needs_critic = args.rl_algorithm == "maac" or args.use_separate_critic
        if needs_critic and critics is None and critic_model is None and args.critic_model_name is None \
                and default_reward_source(agent_model, agents) is None:
            raise ValueError(
                f"critic_model_name must be provided for MARLHF with {args.rl_algorithm.upper()} when agent models "
                "are objects: set args.critic_model_name='<hub id or folder>' or pass critic_model=/critics="
                + (" (or use_separate_critic=False for IAC value heads on the actors)." if args.rl_algorithm == "iac"
                   else ".")
            )
        backend = args.actor_critic_config()
        super().__init__(agent_model=agent_model, agents=agents, tokenizer=tokenizer, critic_model=critic_model,
                         critics=critics, critic_model_name=(args.critic_model_name or default_reward_source(
                             agent_model, agents)) if needs_critic else None,
                         model_config=model_config, lora=lora, args=backend, metrics_callback=metrics_callback,
                         optimizer=optimizer, lr_scheduler=lr_scheduler)
        self.marlhf_args = args
        self.args = _ArgsView(backend, args)
        self._init_stage(args, agent_model, agents, model_config)


def build_marlhf_module(args: MARLHFConfig, **kwargs: Any):
    """The RL-stage module for ``args.rl_algorithm`` (``critic_model``/``critics``/``metrics_callback`` go to
    the actor-critic module only)."""
    if args.is_actor_critic:
        return MARLHFActorCriticModule(args=args, **kwargs)
    for key in ("critic_model", "critics", "metrics_callback"):
        if kwargs.pop(key, None) is not None:
            raise ValueError(f"{key} is only used with rl_algorithm 'maac' or 'iac'; got rl_algorithm="
                             f"{args.rl_algorithm!r}.")
    return MARLHFModule(args=args, **kwargs)
