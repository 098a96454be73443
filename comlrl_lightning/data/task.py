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
from torch.utils.data import DataLoader, Sampler

from comlrl_lightning.data.sources import EvalDataloaders, IndexedList, load_task_setup, resolve_callable


def _collate(batch: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    return list(batch)


_Items = IndexedList  # task items served as (index, item)


class TaskDataModule(EvalDataloaders, L.LightningDataModule):
    """Task items + oracle + formatters (+ external transition) for the RL trainers.

    Args:
        train_dataset: task items (see :func:`~comlrl_lightning.data.sources.load_task_items`).
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


class EpochPermutation(Sampler):
    """A permutation of ``range(n)`` that depends only on ``(seed, epoch)``: drawn from a generator seeded
    ``seed + epoch`` each time the sampler is iterated, ``epoch`` read then from ``epoch_of()`` (the trainer's
    ``current_epoch``; 0 without one). A loader built at epoch 0 and iterated every epoch, and one built at epoch
    ``e`` by a resumed run, give epoch ``e`` the same order."""

    def __init__(self, n: int, seed: int, epoch_of: Callable[[], int] | None = None):
        self.n, self.seed, self.epoch_of = n, int(seed), epoch_of

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        epoch = int(self.epoch_of()) if self.epoch_of is not None else 0
        return iter(torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist())


class ResumableLoader(DataLoader):
    """A single-process DataLoader that a mid-epoch checkpoint resumes where it stopped.

    It implements Lightning's ``_Stateful`` protocol (``state_dict`` / ``load_state_dict``): the fit loop saves its
    state in every checkpoint (``loops.fit_loop.state_dict.combined_loader``) and gives it back before the resumed
    epoch's first batch. The state is the epoch and the number of batches of that epoch handed out: Lightning does not
    prefetch from a loader with a length (``_PrefetchDataFetcher``), so these are the batches trained on when a
    ``ModelCheckpoint`` saves (after ``on_train_batch_end``) or the epoch ends. Resumed in that epoch, the first
    iteration skips those batches by index (no item is read or collated twice) and serves the rest of the same
    permutation; resumed in a later epoch (an end-of-epoch checkpoint), the state is not used. A checkpoint of
    another batch size or dataset size is refused (docs/guide.md §1.1)."""

    def __init__(self, *args: Any, kind: str = "task", epoch_of: Callable[[], int] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.kind = kind
        self.epoch_of = epoch_of
        self._epoch = 0  # epoch of the current (or last) iteration
        self._served = 0  # batches of that epoch handed out
        self._resume: dict | None = None  # a loaded state, applied at the next iteration of its epoch

    def _current_epoch(self) -> int:
        return int(self.epoch_of()) if self.epoch_of is not None else 0

    def __iter__(self):
        return self._serve()

    def _serve(self):
        # runs at the first next(), not at iter(): Lightning creates the resumed epoch's iterator before it settles
        # the epoch counter (a checkpoint of an epoch's last batch resumes in the next epoch)
        epoch = self._current_epoch()
        skip = 0
        if self._resume is not None:
            saved, self._resume = self._resume, None
            if int(saved["epoch"]) == epoch:
                skip = min(int(saved["batches"]), len(self))
        it = super().__iter__()
        if skip:
            if self.num_workers == 0 and hasattr(it, "_sampler_iter"):
                for _ in range(skip):  # advance the batch sampler only: no item is fetched or collated
                    next(it._sampler_iter)
                it._num_yielded += skip
            else:
                for _ in range(skip):
                    next(it)
        self._epoch, self._served = epoch, skip
        for batch in it:
            self._served += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "epoch": self._epoch, "batches": self._served, "batch_size": self.batch_size,
                "num_items": len(self.dataset)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self.state_dict()
        diffs = [f"{key} {state.get(key)!r} (this run: {mine[key]!r})" for key in ("kind", "batch_size", "num_items")
                 if key in state and state[key] != mine[key]]
        if diffs:
            raise ValueError(
                f"The checkpoint was taken {state.get('batches')} batches into epoch {state.get('epoch')} with a "
                f"{state.get('kind')} loader of {', '.join(diffs)}: the rest of that epoch cannot be served as the "
                "interrupted run would have. Resume with the dataset and batch options the checkpoint was written "
                "with, or from an end-of-epoch checkpoint (ModelCheckpoint(every_n_epochs=1, "
                "save_on_train_epoch_end=True)).")
        self._resume = {"epoch": int(state.get("epoch", 0)), "batches": int(state.get("batches", 0))}


def trainer_epoch(trainer: Any) -> Callable[[], int]:
    """``trainer.current_epoch`` read when called (0 without a trainer)."""
    return (lambda: trainer.current_epoch) if trainer is not None else (lambda: 0)


def task_loader(items: list, shuffle: bool, seed: int, trainer: Any) -> DataLoader:
    """The task items as ``[(index, item), ...]`` batches of the module's ``items_per_step()`` (1 without a
    module; at most the whole dataset), shuffled per epoch with ``seed + epoch`` when ``shuffle`` (the epoch at
    iteration time: :class:`EpochPermutation`). A fixed ``generation_batch_size`` above the dataset's size is an
    error. The loader resumes mid-epoch (:class:`ResumableLoader`)."""
    module = trainer.lightning_module if trainer is not None else None
    per_step = module.items_per_step() if module is not None and hasattr(module, "items_per_step") else 1
    fixed = getattr(getattr(module, "args", None), "generation_batch_size", None)
    if fixed is not None and fixed > len(items):
        raise ValueError(f"generation_batch_size={fixed} is larger than the train dataset ({len(items)} items). "
                         f"Set generation_batch_size to at most {len(items)}, or null for the update window.")
    per_step = max(1, min(per_step, len(items)))
    epoch_of = trainer_epoch(trainer)
    sampler = EpochPermutation(len(items), seed, epoch_of) if shuffle else None
    # a private generator keeps DataLoader's worker-seed draw off the global torch RNG
    return ResumableLoader(_Items(items), batch_size=per_step, sampler=sampler, collate_fn=_collate, num_workers=0,
                           generator=torch.Generator().manual_seed(0), kind="task", epoch_of=epoch_of)
