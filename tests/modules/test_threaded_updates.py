"""The threaded-update mixin (comlrl_lightning/modules/threaded_updates.py) on its own, without a fit: what keeps the
updates sequential, how agents are grouped into workers, and that a backward in a worker replays Lightning's
``Strategy.backward`` hook sequence with the hooks on the main thread. Whole fits with overlap (weights equal to the
sequential run, every Lightning hook on the training thread) are tests/modules/test_agent_overlap.py."""

from __future__ import annotations

import threading
import warnings
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, Strategy
from torch import nn

from comlrl_lightning.modules.threaded_updates import ThreadedUpdates


class Host(ThreadedUpdates):
    """The least a host provides: a team, ``args.agent_overlap``, trained modules, devices, a scheduler step."""

    def __init__(self, models, overlap="auto", trainer=None):
        super().__init__()
        self.team = SimpleNamespace(models=models)
        self.args = SimpleNamespace(agent_overlap=overlap)
        self._trainer = trainer
        self.stepped_schedulers: list[tuple[int, int]] = []

    def trainable_modules(self):
        return list(self.team.models)

    def agent_device(self, i):
        return torch.device("cpu")

    def step_scheduler(self, agent):
        self.stepped_schedulers.append((agent, threading.get_ident()))


def _trainer(strategy=None, world_size=1):
    return SimpleNamespace(world_size=world_size, strategy=strategy or SingleDeviceStrategy("cpu"))


def test_overlap_blocker_names_each_reason_and_none_when_nothing_blocks():
    linear = [nn.Linear(2, 2), nn.Linear(2, 2)]
    assert Host(linear).overlap_blocker() == "no trainer is attached"
    assert Host(linear, trainer=_trainer(world_size=2)).overlap_blocker() == "the trainer runs 2 processes"
    assert "DDPStrategy" in Host(linear, trainer=_trainer(DDPStrategy())).overlap_blocker()
    scaled = SingleDeviceStrategy("cpu")
    scaled.precision_plugin = SimpleNamespace(scaler=object())
    assert "scales gradients" in Host(linear, trainer=_trainer(scaled)).overlap_blocker()
    dropout = [nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)), nn.Linear(2, 2)]
    assert "dropout" in Host(dropout, trainer=_trainer()).overlap_blocker()
    assert Host(linear, trainer=_trainer()).overlap_blocker() is None


def test_worker_groups_follow_the_option_and_a_blocker_is_told_once_with_on():
    models = [nn.Linear(2, 2), nn.Linear(2, 2)]
    assert Host(models, "off", _trainer()).update_worker_groups([0, 1]) == [[0, 1]]
    assert Host(models, "on", _trainer()).update_worker_groups([1]) == [[0]]
    assert Host(models, "on", _trainer()).update_worker_groups([0, 1]) == [[0], [1]]  # distinct models
    assert Host(models, "auto", _trainer()).update_worker_groups([0, 1]) == [[0, 1]]  # one device
    shared = Host([models[0], models[0]], "on", _trainer())
    assert shared.update_worker_groups([0, 1]) == [[0, 1]]  # one model object: one worker
    blocked = Host(models, "on", _trainer(world_size=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert blocked.update_worker_groups([0, 1]) == [[0, 1]]
        assert blocked.update_worker_groups([0, 1]) == [[0, 1]]
    told = [w for w in caught if "agent_overlap='on'" in str(w.message)]
    assert len(told) == 1 and "the trainer runs 2 processes" in str(told[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Host(models, "auto", _trainer(world_size=2)).update_worker_groups([0, 1])  # auto says nothing


class RecordingStrategy:
    """The strategy and precision-plugin calls of a backward, each with the thread that made it."""

    def __init__(self, calls):
        self.calls = calls
        self.lightning_module = None
        strategy = self

        class Precision:
            def pre_backward(self, loss, module):
                strategy.calls.append(("precision.pre_backward", threading.get_ident()))
                return loss

            def backward(self, loss, module, optimizer, *args, **kwargs):
                strategy.calls.append(("precision.backward", threading.get_ident()))
                loss.backward()

            def post_backward(self, loss, module):
                strategy.calls.append(("precision.post_backward", threading.get_ident()))
                return loss

        self.precision_plugin = Precision()

    def pre_backward(self, loss):
        self.calls.append(("strategy.pre_backward", threading.get_ident()))

    def post_backward(self, loss):
        self.calls.append(("strategy.post_backward", threading.get_ident()))


def lightning_order() -> list[str]:
    """The calls Lightning's own ``Strategy.backward`` makes, in its order (a release that reorders them fails the
    tests below)."""
    calls: list = []
    reference = RecordingStrategy(calls)
    reference.lightning_module = object()
    Strategy.backward(reference, (nn.Parameter(torch.ones(2)) * 2).sum(), None)
    return [name for name, _ in calls]


def test_a_backward_in_a_worker_runs_there_and_its_hooks_on_the_main_thread():
    expected = lightning_order()

    calls: list = []
    models = [nn.Linear(2, 1), nn.Linear(2, 1)]
    host = Host(models, "on", SimpleNamespace(world_size=1, strategy=RecordingStrategy(calls)))
    main = threading.get_ident()

    def job(agent, handle):
        assert not handle.inline
        host.agent_backward(models[agent](torch.ones(1, 2)).sum(), handle)
        return threading.get_ident()

    workers = host.run_agent_updates([0, 1], job, groups=[[0], [1]])
    assert main not in workers and len(set(workers)) == 2
    for worker in workers:
        mine = [name for name, thread in calls if thread == worker]
        assert mine == ["precision.backward"]
    assert sorted(name for name, _ in calls) == sorted(expected * 2)
    hooks = [(name, thread) for name, thread in calls if name != "precision.backward"]
    assert all(thread == main for _, thread in hooks)
    assert all(m.weight.grad is not None for m in models)


def test_a_backward_in_a_worker_replays_lightnings_hook_sequence():
    calls: list = []
    model = nn.Linear(2, 1)
    host = Host([model, nn.Linear(2, 1)], "on", SimpleNamespace(world_size=1, strategy=RecordingStrategy(calls)))

    def job(agent, handle):
        if agent == 0:
            host.agent_backward(model(torch.ones(1, 2)).sum(), handle)

    host.run_agent_updates([0, 1], job, groups=[[0], [1]])
    assert [name for name, _ in calls] == lightning_order() == [
        "strategy.pre_backward", "precision.pre_backward", "precision.backward", "precision.post_backward",
        "strategy.post_backward"]


def test_agent_step_steps_the_optimizer_and_the_scheduler_on_the_main_thread():
    models = [nn.Linear(2, 1), nn.Linear(2, 1)]
    host = Host(models, "on", _trainer())
    stepped = []

    class Optimizer:
        def __init__(self, agent):
            self.agent = agent

        def step(self):
            stepped.append((self.agent, threading.get_ident()))

    host.run_agent_updates([0, 1], lambda a, handle: host.agent_step(Optimizer(a), handle, scheduler_of=a),
                           groups=[[0], [1]])
    main = threading.get_ident()
    assert sorted(stepped) == [(0, main), (1, main)]
    assert sorted(host.stepped_schedulers) == [(0, main), (1, main)]


def test_one_group_runs_inline_with_lightnings_manual_backward(monkeypatch):
    host = Host([nn.Linear(2, 1), nn.Linear(2, 1)], "off", _trainer())
    seen = []
    monkeypatch.setattr(host, "manual_backward", lambda loss: seen.append(threading.get_ident()))
    host.run_agent_updates([0, 1], lambda a, handle: host.agent_backward(torch.zeros(()), handle))
    assert seen == [threading.get_ident()] * 2


@pytest.mark.parametrize("mode", ["on", "auto"])
def test_results_come_back_in_agent_order(mode):
    host = Host([nn.Linear(2, 1), nn.Linear(2, 1), nn.Linear(2, 1)], mode, _trainer())
    assert host.run_agent_updates([2, 0, 1], lambda a, handle: a * 10) == [20, 0, 10]
