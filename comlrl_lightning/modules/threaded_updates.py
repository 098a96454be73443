"""The agents' updates at the same time (option ``agent_overlap``; docs/architecture.md, "Devices"): a mixin of
:class:`~comlrl_lightning.modules.base.TeamModuleBase`.

A module hands one job per agent to :meth:`ThreadedUpdates.run_agent_updates`; the jobs run in worker threads
(:func:`~comlrl_lightning.overlap.run_jobs`), one thread per group of agents that share no parameters. A job does
its tensor work itself and hands Lightning's part to the main thread: :meth:`ThreadedUpdates.agent_backward` replays
the hook sequence of Lightning's ``Strategy.backward`` around a backward that runs in the worker, and
:meth:`ThreadedUpdates.agent_step` steps the optimizer (which counts ``global_step`` and runs the
``on_before_optimizer_step`` hooks) there. With one group the jobs run in order on the calling thread, through the
same code, and :meth:`~ThreadedUpdates.agent_backward` is Lightning's own ``manual_backward``.

:meth:`ThreadedUpdates.overlap_blocker` names what makes a fit run the updates one after another whatever
``agent_overlap`` says (tests: tests/modules/test_agent_overlap.py, tests/modules/test_threaded_updates.py).

The host (a LightningModule) provides ``team``, ``args.agent_overlap``, ``trainable_modules()``,
``agent_device(i)``, ``manual_backward`` and ``step_scheduler(agent)``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy, Strategy
from torch import nn

from comlrl_lightning.devices import draws_random_numbers, normalize_agent_overlap, update_groups
from comlrl_lightning.overlap import MainThread, run_jobs


class ThreadedUpdates(L.LightningModule):
    """Run the agents' update jobs in worker threads, with Lightning's backward hooks and optimizer steps on the
    main thread (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: set once :meth:`update_worker_groups` has told that ``agent_overlap="on"`` cannot overlap this fit
        self._told_overlap_blocker = False

    def overlap_blocker(self) -> str | None:
        """Why this fit runs the agents' updates one after another whatever ``agent_overlap`` says, else None:
        several processes (DDP's gradient hooks serve one backward at a time), a strategy other than Lightning's
        single-device one or one with its own ``backward``, a gradient scaler (one scaler for every agent, updated
        after each step, would depend on the steps' timing), or a trained module whose forward draws random numbers
        (dropout: two threads would share the global generator)."""
        trainer = self._trainer
        if trainer is None:
            return "no trainer is attached"
        if trainer.world_size > 1:
            return f"the trainer runs {trainer.world_size} processes"
        strategy = trainer.strategy
        if not isinstance(strategy, SingleDeviceStrategy) or type(strategy).backward is not Strategy.backward:
            return f"the strategy is {type(strategy).__name__}, not Lightning's SingleDeviceStrategy"
        if getattr(strategy.precision_plugin, "scaler", None) is not None:  # Lightning's MixedPrecision, FSDP's
            return "the precision plugin scales gradients (16-mixed)"
        if any(draws_random_numbers(m) for m in self.trainable_modules()):
            return "a trained model has dropout (its forward draws from the global RNG)"
        return None

    def update_worker_groups(self, agents: Sequence[int], members: Sequence[Sequence[nn.Module]] | None = None
                             ) -> list[list[int]]:
        """Positions in ``agents`` grouped into the workers of :meth:`run_agent_updates`: one group (in order) with
        ``agent_overlap="off"``, for a single agent, or when :meth:`overlap_blocker` names a reason (told once, with
        "on"); else :func:`~comlrl_lightning.devices.update_groups` of ``members`` (``members[j]``: the modules the
        job of ``agents[j]`` touches; default: that agent's model)."""
        agents = list(agents)
        if members is None:
            members = [[self.team.models[a]] for a in agents]
        mode = normalize_agent_overlap(self.args.agent_overlap)
        if mode == "off" or len(agents) < 2:
            return [list(range(len(agents)))]
        blocker = self.overlap_blocker()
        if blocker is None:
            return update_groups(members, mode)
        if mode == "on" and not self._told_overlap_blocker:
            self._told_overlap_blocker = True
            warnings.warn(f"agent_overlap='on': the agents' updates run one after another because {blocker} "
                          "(docs/architecture.md, \"Devices\"). Generation still overlaps.", stacklevel=3)
        return [list(range(len(agents)))]

    def run_agent_updates(self, agents: Sequence[int], job: Callable[[int, MainThread], Any],
                          members: Sequence[Sequence[nn.Module]] | None = None,
                          groups: Sequence[Sequence[int]] | None = None) -> list[Any]:
        """``job(agent, main)`` for each of ``agents``; the results in that order.

        The jobs run in the workers of :meth:`update_worker_groups` (or ``groups``, computed by it before), the
        workers at the same time, one thread each (:func:`~comlrl_lightning.overlap.run_jobs`). A job does its
        tensor work itself and hands Lightning's part to ``main``: :meth:`agent_backward` and :meth:`agent_step`.
        Each job's own work keeps its order and the agents share no parameters or RNG, so the weights equal the
        agent-after-agent run."""
        agents = list(agents)
        if groups is None:
            groups = self.update_worker_groups(agents, members)
        jobs = [functools.partial(job, a) for a in agents]
        return run_jobs(jobs, groups, [self.agent_device(a) for a in agents], name="agent-update")

    def agent_backward(self, loss: torch.Tensor, main: MainThread) -> None:
        """``manual_backward(loss)`` from a job of :meth:`run_agent_updates`: in a worker, the backward itself runs
        there and Lightning's hooks before and after it (strategy, precision plugin, ``on_before_backward`` /
        ``on_after_backward``) on the main thread, in the order ``Strategy.backward`` calls them."""
        if main.inline:
            self.manual_backward(loss)
            return
        loss = main.call(self._before_backward, loss)
        self.trainer.strategy.precision_plugin.backward(loss, self, None)
        main.call(self._after_backward, loss)

    def _before_backward(self, loss: torch.Tensor) -> torch.Tensor:
        strategy = self.trainer.strategy
        strategy.pre_backward(loss)
        return strategy.precision_plugin.pre_backward(loss, self)

    def _after_backward(self, loss: torch.Tensor) -> None:
        strategy = self.trainer.strategy
        strategy.post_backward(strategy.precision_plugin.post_backward(loss, self))

    def agent_step(self, optimizer: Any, main: MainThread, scheduler_of: int | None = None) -> None:
        """``optimizer.step()`` (Lightning's: it counts ``global_step`` and runs ``on_before_optimizer_step``), then
        the scheduler of agent ``scheduler_of`` if given, on the main thread."""
        main.call(self._step, optimizer, scheduler_of)

    def _step(self, optimizer: Any, scheduler_of: int | None) -> None:
        optimizer.step()
        if scheduler_of is not None:
            self.step_scheduler(scheduler_of)
