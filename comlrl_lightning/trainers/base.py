"""TeamTrainer: the part every facade shares (args, input checks, the ``lightning.Trainer``, train, save).

A facade keeps CoMLRL's constructor signature and only says what differs: its config class, its module,
data module and callbacks, and the number of epochs. Its ``__init__`` calls :meth:`TeamTrainer._init_args`
first and :meth:`TeamTrainer._init_trainer` last.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable
from typing import Any, ClassVar

import lightning as L

from comlrl_lightning.config.secrets import argv_without, secret_values
from comlrl_lightning.trainers.common import check_facade_inputs, sync_num_agents, trainer_kwargs_for

_FIT_KEYWORDS = ("weights_only",)


class TeamTrainer:
    """Base of ``MADPOTrainer`` & co.: ``args``, ``module``, ``datamodule``, ``trainer``; ``train``, ``save_model``.

    Class attributes: ``config_cls`` (the default ``args``), ``args_cls`` (the type ``args`` must have; default
    ``config_cls``), ``algorithm_name`` (the W&B run's ``algorithm``) and ``num_agents_from_agents`` (whether
    ``agents`` alone sets ``args.num_agents``, see :func:`~comlrl_lightning.trainers.common.sync_num_agents`).
    """

    config_cls: ClassVar[type]
    args_cls: ClassVar[type | None] = None
    algorithm_name: ClassVar[str]
    num_agents_from_agents: ClassVar[bool] = True

    args: Any
    module: L.LightningModule
    datamodule: L.LightningDataModule
    trainer: L.Trainer

    def _init_args(self, args: Any, agent_model: Any, agents: Any, reward_func: Any, train_dataset: Any,
                   num_agents: int | None = None) -> None:
        """Set ``self.args`` (default ``config_cls()``), check its type and the inputs, settle ``num_agents``."""
        self.args = args if args is not None else self.config_cls()
        accepted = self.args_cls or self.config_cls
        if not isinstance(self.args, accepted):
            raise TypeError(f"{type(self).__name__} needs args of type {accepted.__name__}; got "
                            f"{type(self.args).__name__}.")
        check_facade_inputs(agent_model, agents, reward_func, train_dataset)
        if self.num_agents_from_agents:  # centralized: args.num_agents is the role count, not len(agents)
            centralized = getattr(self.args, "collaboration_mode", None) == "centralized"
            sync_num_agents(self.args, None if centralized else agents, num_agents)

    def _centralized(self, agents: Any, tokenizer: Any, formatters: Any, reward_func: Any, adapter: Any
                     ) -> tuple[Any, list, Any]:
        """``collaboration_mode="centralized"`` (docs/coming-from-comlrl.md): one learner writes every role in one
        joint text. Returns the learner's args (``num_agents=1``, decentralized inside), its only formatter (the
        adapter's joint prompt) and the task reward over joint texts (parsed by the adapter; default: CoMLRL's
        tagged format).

        Iterative configs: the comparator is forced to centralized generation, done here by a one-agent
        comparator on the same joint prompt, so its completions stay unparsed joint texts (pairs and replay
        files hold raw joint texts). ``comparator_agents``/``comparator_devices`` given per role keep the
        ``comparator_centralized_agent_index`` entry."""
        import dataclasses

        from comlrl_lightning.collaboration import CentralizedPrompt, CentralizedReward
        from comlrl_lightning.comparators.centralized import TaggedCentralizedComparatorAdapter
        from comlrl_lightning.data.sources import build_formatters

        if agents is not None and len(agents) != 1:
            raise ValueError("Centralized collaboration requires exactly one actor model.")
        if isinstance(tokenizer, (list, tuple)) and len(tokenizer) != 1:
            raise ValueError("Centralized collaboration requires one actor tokenizer.")
        adapter = adapter if adapter is not None else TaggedCentralizedComparatorAdapter()
        for name in ("build_prompt", "parse_completion"):
            if not callable(getattr(adapter, name, None)):
                raise TypeError(f"centralized_comparator_adapter.{name} must be callable.")
        roles = build_formatters(formatters, self.args.num_agents)
        changes: dict[str, Any] = {"num_agents": 1, "collaboration_mode": "decentralized"}
        if hasattr(self.args, "comparator_generation_mode"):
            idx = self.args.comparator_centralized_agent_index
            changes.update(comparator_generation_mode="decentralized", comparator_centralized_agent_index=0)
            for name in ("comparator_agents", "comparator_devices"):
                value = getattr(self.args, name)
                if isinstance(value, (list, tuple)) and len(value) > 1:
                    changes[name] = [value[idx]]
        learner = dataclasses.replace(self.args, **changes)
        self._joint_reward = CentralizedReward(adapter, reward_func, roles)  # splits eval texts for eval_logger
        return learner, [CentralizedPrompt(adapter, roles)], self._joint_reward

    def _init_trainer(self, max_epochs: int, callbacks: Iterable[L.Callback], wandb_config: dict | None,
                      trainer_kwargs: dict | None, **forced: Any) -> None:
        """``self.trainer`` with the facades' defaults, the user's ``trainer_kwargs``, then ``forced`` (settings
        the facade cannot run without, e.g. ``reload_dataloaders_every_n_epochs=1`` for rounds)."""
        kwargs = trainer_kwargs_for(max_epochs, self.args, self.algorithm_name, wandb_config, trainer_kwargs)
        kwargs.update(forced)
        from comlrl_lightning.callbacks.progress import with_progress_bar

        given = [*callbacks, *(kwargs.pop("callbacks", None) or [])]
        self.trainer = L.Trainer(callbacks=with_progress_bar(given, kwargs.get("enable_progress_bar", True)),
                                 **kwargs)

    @property
    def team(self):
        """The module's :class:`~comlrl_lightning.agents.AgentTeam`."""
        return self.module.team

    @property
    def env_step(self) -> int:
        """The module's environment steps (samples per agent) so far."""
        return self.module.env_step

    def _evaluation(self, has_eval: bool, eval_logger: Any = None, eval_aggregator: Any = None) -> Any:
        """The task-reward evaluation callback (with CoMLRL's ``eval_logger``/``eval_aggregator``); without eval
        data, every evaluation option or argument that was set warns once, naming it (nothing is silently
        ignored). Under centralized collaboration ``eval_logger`` receives the joint texts split per role."""
        from comlrl_lightning.callbacks import TaskRewardEvaluation

        if eval_logger is not None and getattr(self, "_joint_reward", None) is not None:
            from comlrl_lightning.collaboration import CentralizedEvalLogger

            eval_logger = CentralizedEvalLogger(self._joint_reward, eval_logger)  # per-role texts, as CoMLRL
        if not has_eval:
            fields = getattr(type(self.args), "__dataclass_fields__", {})
            for name in ("eval_batch_size",):  # eval_interval/eval_num_samples keep CoMLRL's defaults in most configs
                if name in fields and getattr(self.args, name) != fields[name].default:
                    warnings.warn(f"{type(self).__name__}: {name}={getattr(self.args, name)!r} has no effect "
                                  "without an eval_dataset.", UserWarning, stacklevel=3)
            for name, value in (("eval_logger", eval_logger), ("eval_aggregator", eval_aggregator)):
                if value is not None:
                    warnings.warn(f"{type(self).__name__}: {name} has no effect without an eval_dataset.",
                                  UserWarning, stacklevel=3)
        elif getattr(self.args, "num_turns", 1) > 1 and getattr(self.args, "eval_batch_size", 1) != 1:
            warnings.warn(f"{type(self).__name__}: eval_batch_size={self.args.eval_batch_size} has no effect with "
                          f"num_turns={self.args.num_turns}: multi-turn evaluation rolls out one item at a time "
                          "(as CoMLRL).", UserWarning, stacklevel=3)
        return TaskRewardEvaluation(eval_logger=eval_logger, eval_aggregator=eval_aggregator)

    def _unused_transition(self, external_transition: Any) -> None:
        """CoMLRL's preference trainers accept ``external_transition`` but support ``num_turns=1`` only, where
        no transition is ever called: accepted, with a warning that says so."""
        if external_transition is not None:
            warnings.warn(f"{type(self).__name__}: external_transition has no effect: preference trainers run "
                          f"num_turns=1 (as in CoMLRL), so no transition is called.", UserWarning, stacklevel=3)

    def train(self, ckpt_path: str | None = None, **kwargs: Any) -> dict[str, float]:
        """Fit (resuming from ``ckpt_path`` if given); returns the final callback metrics as floats.

        As in CoMLRL, the other keyword arguments are forwarded to ``generate`` in every sampling call
        (``do_sample`` excepted); ``weights_only`` still goes to ``Trainer.fit``."""
        fit_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in _FIT_KEYWORDS}
        if kwargs:
            self.module.generation_kwargs = dict(kwargs)
        # W&B records sys.argv when its run starts: a key the script took on its command line stays out of it
        with argv_without(secret_values(dataclasses.asdict(self.args))):
            self.trainer.fit(self.module, datamodule=self.datamodule, ckpt_path=ckpt_path, **fit_kwargs)
        return {k: float(v) for k, v in self.trainer.callback_metrics.items()}

    def save_model(self, output_dir: str) -> list[str]:
        """Write ``output_dir/agent_{i}/`` for each agent (model + tokenizer, or the LoRA adapter; actor-critic
        adds its critics); returns the paths written."""
        return self.module.save_agents(output_dir)
