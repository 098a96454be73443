"""Agents' work at the same time, one worker thread per group of agents (option ``agent_overlap``;
docs/architecture.md, "Devices").

Two users: the HF engine runs the agents' ``generate`` calls of one level this way, and the team modules run the
agents' updates of one drain this way (:meth:`~comlrl_lightning.modules.base.TeamModuleBase.run_agent_updates`).

A worker only does tensor work on its own agents' models (forward, ``backward``, ``zero_grad``). Everything that
goes through Lightning or touches state shared by the agents (the optimizer step, which counts ``global_step`` and
runs the ``on_before_optimizer_step`` hooks; the backward hooks; schedulers; counters) is handed to the thread
that called :func:`run_jobs` through :meth:`MainThread.call`, which runs it there, one call at a time, and returns
its result to the worker. A job is written once against that handle: with one group, :func:`run_jobs` runs the
jobs in order on the calling thread and ``call`` is a plain call, so the serial path is the same code.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch


class OverlapCancelled(RuntimeError):
    """Raised inside a worker's :meth:`MainThread.call` once another worker has failed (or the caller was
    interrupted): the worker stops at its next hand-over instead of applying more updates."""


class MainThread:
    """The handle a job receives. :meth:`call` runs ``fn(*args, **kwargs)`` on the thread that called
    :func:`run_jobs` and returns its result (or raises its exception) in the job's thread. ``inline`` is True when
    the job itself runs on that thread (one group: nothing overlaps)."""

    inline = True

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


class _Request:
    __slots__ = ("fn", "args", "kwargs", "done", "result", "error")

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


_FINISHED = object()


class _Handover(MainThread):
    """:class:`MainThread` of a worker: each call is queued for the main thread, and the worker waits for it."""

    inline = False

    def __init__(self, requests: queue.Queue, cancelled: threading.Event):
        self.requests = requests
        self.cancelled = cancelled

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.cancelled.is_set():
            raise OverlapCancelled("another agent's worker failed; this one stops")
        request = _Request(fn, args, kwargs)
        self.requests.put(request)
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.result


def worker_context() -> Callable[..., Any]:
    """A runner ``run(fn, *args, device=...)`` that calls ``fn(*args)`` in a worker thread under the caller's
    thread-local torch state: autocast (a worker would otherwise compute in full precision under a mixed-precision
    fit), grad mode, and ``device`` as the current CUDA device. Build it on the calling thread."""
    autocast = [(d, torch.get_autocast_dtype(d)) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)]
    grad = torch.is_grad_enabled()

    def run(fn: Callable[..., Any], *args: Any, device: torch.device | None = None) -> Any:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.set_grad_enabled(grad))
            if device is not None and device.type == "cuda":
                stack.enter_context(torch.cuda.device(device))
            for device_type, dtype in autocast:
                stack.enter_context(torch.autocast(device_type, dtype=dtype))
            return fn(*args)

    return run


def run_jobs(jobs: Sequence[Callable[[MainThread], Any]], groups: Sequence[Sequence[int]],
             devices: Sequence[torch.device | None] | None = None, name: str = "agent-overlap") -> list[Any]:
    """Run every job and return their results in job order.

    ``groups``: the job indices split into workers (as :func:`~comlrl_lightning.devices.overlap_groups` gives
    them); a worker runs its jobs one after another in the order given, and different workers run at the same time.
    With one group, every job runs here, in that order, with a plain :class:`MainThread`. ``devices[i]``: the
    current CUDA device of job i's worker (None: leave it).

    While workers run, this thread serves their :meth:`MainThread.call` requests in arrival order. When a job
    raises, the other workers are cancelled at their next hand-over (:class:`OverlapCancelled`); once every worker
    has stopped, the first error in job order is raised (an error of a cancelled worker is never the one raised).
    An interrupt here (Ctrl-C) cancels the workers the same way, waits for them, and is raised again.
    """
    order = [i for group in groups for i in group]
    if sorted(order) != list(range(len(jobs))):
        raise ValueError(f"groups {list(map(list, groups))} must hold each of the {len(jobs)} job indices once.")
    results: list[Any] = [None] * len(jobs)
    if len(groups) < 2:
        inline = MainThread()
        for i in order:
            results[i] = jobs[i](inline)
        return results
    requests: queue.Queue = queue.Queue()
    cancelled = threading.Event()
    errors: dict[int, BaseException] = {}
    runner = worker_context()

    def work(group: Sequence[int]) -> None:
        handle = _Handover(requests, cancelled)
        try:
            for i in group:
                try:
                    results[i] = runner(jobs[i], handle, device=devices[i] if devices is not None else None)
                except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
                    errors[i] = exc
                    cancelled.set()
                    return
        finally:
            requests.put(_FINISHED)

    threads = [threading.Thread(target=work, args=(g,), name=f"{name}-{k}", daemon=True)
               for k, g in enumerate(groups)]
    for t in threads:
        t.start()
    running = len(threads)
    interrupt: BaseException | None = None
    while running:
        try:
            item = requests.get()
        except BaseException as exc:  # Ctrl-C while waiting: stop the workers, then re-raise
            interrupt = interrupt or exc
            cancelled.set()
            continue
        if item is _FINISHED:
            running -= 1
            continue
        if cancelled.is_set():
            item.error = OverlapCancelled("another agent's worker failed; this one stops")
        else:
            try:
                item.result = item.fn(*item.args, **item.kwargs)
            except BaseException as exc:  # noqa: BLE001 - raised again in the worker that asked
                item.error = exc
        item.done.set()
    for t in threads:
        t.join()
    if interrupt is not None:
        raise interrupt
    real = [i for i in sorted(errors) if not isinstance(errors[i], OverlapCancelled)]
    if real:
        raise errors[real[0]]
    if errors:
        raise errors[min(errors)]
    return results
