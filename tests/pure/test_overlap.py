"""``run_jobs`` (comlrl_lightning/overlap.py): workers at the same time, hand-overs served on the calling thread,
errors and cancellation; ``update_groups`` and ``draws_random_numbers`` (comlrl_lightning/devices.py)."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from comlrl_lightning.devices import draws_random_numbers, update_groups
from comlrl_lightning.overlap import MainThread, OverlapCancelled, run_jobs


def test_one_group_runs_every_job_here_in_group_order_with_a_plain_handle():
    seen = []

    def job(k):
        def run(main):
            seen.append((k, threading.get_ident(), main.inline, main.call(lambda x: x + 1, k)))
            return k * 10
        return run

    assert run_jobs([job(0), job(1), job(2)], [[2, 0, 1]]) == [0, 10, 20]
    here = threading.get_ident()
    assert seen == [(2, here, True, 3), (0, here, True, 1), (1, here, True, 2)]


def test_groups_run_at_the_same_time_and_hand_overs_run_on_the_calling_thread():
    """Each job waits at a barrier that only opens when both workers are inside their jobs at once (a sequential
    run would break it at its timeout, not hang); every ``main.call`` runs on this thread."""
    barrier = threading.Barrier(2, timeout=10)
    here = threading.get_ident()
    calls = []

    def job(k):
        def run(main):
            assert not main.inline
            barrier.wait()
            worker = threading.get_ident()
            got = main.call(lambda: (calls.append(k), threading.get_ident())[1])
            return worker, got
        return run

    out = run_jobs([job(0), job(1)], [[0], [1]])
    assert {got for _, got in out} == {here}
    assert len({worker for worker, _ in out}) == 2 and here not in {worker for worker, _ in out}
    assert sorted(calls) == [0, 1]


def test_a_worker_runs_its_group_in_order():
    order = []
    lock = threading.Lock()

    def job(k):
        def run(main):
            with lock:
                order.append(k)
            return main.call(lambda: k)
        return run

    assert run_jobs([job(k) for k in range(4)], [[3, 1], [0, 2]]) == [0, 1, 2, 3]
    assert order.index(3) < order.index(1) and order.index(0) < order.index(2)


def test_a_failed_job_cancels_the_others_at_their_next_hand_over_and_its_error_is_raised():
    failed = threading.Event()
    steps = []

    def bad(main):
        main.call(lambda: None)
        failed.set()
        raise FloatingPointError("agent 0's loss is nan")

    def good(main):
        for step in range(100):
            if step == 1:
                failed.wait(10)
            main.call(steps.append, step)
        return "done"

    with pytest.raises(FloatingPointError, match="agent 0's loss is nan"):
        run_jobs([bad, good], [[0], [1]])
    assert len(steps) < 100  # the good worker stopped at a hand-over after the failure


def test_an_error_of_a_hand_over_is_raised_in_the_worker_and_then_here():
    def job(main):
        try:
            main.call(lambda: 1 / 0)
        except ZeroDivisionError:
            return "seen in the worker"

    assert run_jobs([job, lambda main: "other"], [[0], [1]]) == ["seen in the worker", "other"]
    with pytest.raises(ZeroDivisionError):
        run_jobs([lambda main: main.call(lambda: 1 / 0), lambda main: None], [[0], [1]])


def test_cancelled_error_is_never_the_one_raised_and_bad_groups_are_refused():
    gate = threading.Event()

    def first(main):
        gate.wait(10)
        raise KeyError("the real one")

    stopped_by = []

    def second(main):
        gate.set()
        try:
            while True:
                main.call(lambda: None)
        except BaseException as exc:
            stopped_by.append(type(exc))
            raise

    with pytest.raises(KeyError, match="the real one"):
        run_jobs([second, first], [[0], [1]])  # job 0's OverlapCancelled comes first in job order, yet is not raised
    assert stopped_by == [OverlapCancelled]
    with pytest.raises(ValueError, match=r"must hold each of the 2 job indices once"):
        run_jobs([lambda m: 0, lambda m: 1], [[0], [0]])


def test_workers_inherit_grad_mode_and_autocast_of_the_caller():
    def job(main):
        return torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")

    with torch.no_grad():
        assert run_jobs([job, job], [[0], [1]]) == [(False, False)] * 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert run_jobs([job, job], [[0], [1]]) == [(True, True)] * 2
    assert isinstance(MainThread(), MainThread) and MainThread.inline


# --- who overlaps ----------------------------------------------------------------------------------------------

class _Shared(nn.Module):
    def __init__(self, base: nn.Module):
        super().__init__()
        self.base = base
        self.head = nn.Linear(2, 1)


def test_update_groups_join_jobs_that_share_a_parameter_or_a_device():
    a, b, critic = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 1)
    base = nn.Linear(2, 2)
    assert update_groups([[a], [b]], "on") == [[0], [1]]
    assert update_groups([[a], [b]], "off") == [[0, 1]]
    assert update_groups([[a], [b]], "auto") == [[0, 1]]  # both on the CPU
    assert update_groups([[a, critic], [b, critic]], "on") == [[0, 1]]  # MAAC: one critic
    assert update_groups([[_Shared(base)], [b], [_Shared(base)]], "on") == [[0, 2], [1]]  # adapters of one base
    assert update_groups([[a], [a], [b]], "on") == [[0, 1], [2]]
    with pytest.raises(ValueError, match="overlap mode"):
        update_groups([[a]], "threads")


def test_draws_random_numbers_sees_dropout_modules_and_attention_dropout():
    assert not draws_random_numbers(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.0)))
    assert draws_random_numbers(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)))

    class WithConfig(nn.Linear):
        def __init__(self, p):
            super().__init__(2, 2)
            self.config = type("Config", (), {"attention_dropout": p})()

    assert draws_random_numbers(WithConfig(0.1)) and not draws_random_numbers(WithConfig(0.0))
