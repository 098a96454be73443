"""TaskDataModule: task items, formatters, the task-reward oracle and the external transition.

The train dataloader yields the task items of one update window per step (``[(index, item), ...]``, the module's
``items_per_step()``; docs/multiturn.md §2.11), as the rollout-tree trainers consume them. ``eval_items``,
``formatters`` and ``oracle`` are the attributes :class:`~comlrl_lightning.callbacks.TaskRewardEvaluation` reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from comlrl_lightning.data.tasks import EvalDataloaders, IndexedList, load_task_setup, resolve_callable


def _collate(batch: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    return list(batch)


_Items = IndexedList  # task items served as (index, item)


class TaskDataModule(EvalDataloaders, L.LightningDataModule):
    """Task items + oracle + formatters (+ external transition) for the RL trainers.

    Args:
        train_dataset: task items (see :func:`~comlrl_lightning.data.tasks.load_task_items`).
        eval_dataset: evaluation items (None = no evaluation).
        reward_func: the task reward (callable or dotted path).
        reward_processor: optional float → float applied to every raw reward.
        formatters: None, one callable, or one per agent (callables or dotted paths).
        external_transition: the multi-turn transition (callable or dotted path; None for single turn).
        external_transition_options: when given, ``external_transition`` is a factory called with these
            keyword arguments (e.g. ``make_code_transition`` with ``{"mode": "level_feedback"}``). A transition
            with a ``register(items)`` method is given the train and eval items.
        external: the code environment's ``external.*`` config keys as documented by CoMLRL (``mode``,
            ``sandbox_slice``, ``original_prompt``, ``previous_response``, ``expert_model``, ...): the options of
            ``external_transition`` (default :func:`~comlrl_lightning.envs.code.make_code_transition`); the same
            as ``external_transition_options`` with CoMLRL's key names.
        num_agents: number of agents (checked against the module's team in ``setup``).
        prompt_field: the item field holding the raw prompt.
        shuffle: shuffle the items every epoch (upstream: no shuffle).
        seed: seed of the per-epoch shuffle (epoch e uses ``seed + e``).
        reward_timeout: seconds one ``reward_func`` call may take (None: no limit); a call past it stops the run
            with an error naming the task item and the function (docs/multiturn.md §6.4).
        transition_timeout: the same for one ``external_transition`` call (the error names the turn, the branch
            and the item's prompt).
    """

    def __init__(
        self,
        train_dataset: Any = "builtin:cooperative",
        eval_dataset: Any = "builtin:cooperative_eval",
        reward_func: Callable | str | None = "comlrl_lightning.envs.cooperative.cooperative_reward",
        reward_processor: Callable | str | None = None,
        formatters: Any = "comlrl_lightning.envs.cooperative.FORMATTERS",
        external_transition: Callable | str | None = None,
        external_transition_options: dict | None = None,
        num_agents: int = 2,
        external: dict | None = None,
        prompt_field: str = "prompt",
        shuffle: bool = False,
        seed: int = 0,
        reward_timeout: float | None = None,
        transition_timeout: float | None = None,
    ):
        super().__init__()
        from comlrl_lightning.multiturn.transitions import bound_transition, check_transition_signature
        from comlrl_lightning.rewards import RewardOracle, check_timeout_option

        self.reward_timeout = check_timeout_option("reward_timeout", reward_timeout)
        self.transition_timeout = check_timeout_option("transition_timeout", transition_timeout)
        self.oracle, self.formatters, self.train_items, self.eval_items = load_task_setup(
            train_dataset, eval_dataset, reward_func, reward_processor, formatters, num_agents, prompt_field)
        if self.reward_timeout is not None:
            self.oracle = RewardOracle(self.oracle.reward_func, self.oracle.reward_processor, self.reward_timeout)
        transition = resolve_callable(external_transition, "external_transition")
        if external is not None:
            if external_transition_options is not None:
                raise ValueError("Give external (CoMLRL's keys) or external_transition_options, not both.")
            from comlrl_lightning.envs.code.transitions import external_options, make_code_transition

            external_transition_options = external_options(external)
            transition = transition or make_code_transition
        if external_transition_options is not None:
            if transition is None:
                raise ValueError("external_transition_options needs external_transition (a factory to call).")
            transition = transition(**external_transition_options)  # e.g. make_code_transition(mode=...)
        check_transition_signature(transition)  # a transition that cannot take the arguments: an error now
        self.external_transition = transition
        self.num_agents = num_agents
        self.prompt_field = prompt_field
        if hasattr(transition, "register"):  # transitions that look tasks up by prompt (code environment)
            transition.register(self.train_items + self.eval_items)
        self.external_transition = bound_transition(transition, self.transition_timeout)
        if not self.train_items:
            raise ValueError("train_dataset is empty: there is nothing to train on.")
        self.shuffle = shuffle
        self.seed = seed

    def setup(self, stage: str) -> None:
        module = self.trainer.lightning_module if self.trainer is not None else None
        team = getattr(module, "team", None)
        if team is not None and team.num_agents != self.num_agents:
            raise ValueError(f"The data module was built for num_agents={self.num_agents} but the module has "
                             f"{team.num_agents} agents.")

    def train_dataloader(self) -> DataLoader:
        return task_loader(self.train_items, self.shuffle, self.seed, self.trainer)


def task_loader(items: list, shuffle: bool, seed: int, trainer: Any) -> DataLoader:
    """The task items as ``[(index, item), ...]`` batches of the module's ``items_per_step()`` (1 without a
    module; at most the whole dataset), shuffled per epoch with ``seed + epoch`` when ``shuffle``. A fixed
    ``generation_batch_size`` above the dataset's size is an error."""
    epoch = trainer.current_epoch if trainer is not None else 0
    module = trainer.lightning_module if trainer is not None else None
    per_step = module.items_per_step() if module is not None and hasattr(module, "items_per_step") else 1
    fixed = getattr(getattr(module, "args", None), "generation_batch_size", None)
    if fixed is not None and fixed > len(items):
        raise ValueError(f"generation_batch_size={fixed} is larger than the train dataset ({len(items)} items). "
                         f"Set generation_batch_size to at most {len(items)}, or null for the update window.")
    per_step = max(1, min(per_step, len(items)))
    g = torch.Generator().manual_seed(int(seed) + int(epoch))
    return DataLoader(_Items(items), batch_size=per_step, shuffle=shuffle, generator=g, collate_fn=_collate,
                      num_workers=0)
