"""Run model-written Python against HumanEval-style tests in an isolated child process.

Model code never runs in the calling process. Each call starts ``python -I -S`` on
``_sandbox_child.py`` with:

* a fresh session and process group, a private temporary working directory (removed afterwards)
  and a minimal environment (``PATH``, ``LANG``, ``HOME``/``TMPDIR`` = the temp dir): no secrets;
* new network, pid and IPC namespaces when the kernel allows it (root, or unprivileged user
  namespaces). The network namespace has no interfaces up, so nothing is reachable, not even the
  host's 127.0.0.1. Otherwise sockets are blocked inside the interpreter (``socket-block``, best
  effort: a process started by the code is not covered). :func:`isolation_level` says which;
* when started as root: a drop to an unprivileged uid (``nobody`` by default) before any model
  code runs, because the kernel does not enforce ``RLIMIT_NPROC`` for root;
* ``RLIMIT_AS`` (memory), ``RLIMIT_CPU``, ``RLIMIT_FSIZE`` (largest file), ``RLIMIT_NOFILE``,
  ``RLIMIT_NPROC`` and no core dumps; ``PR_SET_NO_NEW_PRIVS``;
* stdout/stderr of the code captured into capped buffers (the process's own fds 1/2 go to
  ``/dev/null``), so output floods cost nothing.

One child runs the code once and then every test case in turn, each under its own alarm
(``timeout_s``), and reports one JSON line per case on a private pipe. The parent also keeps a
wall-clock deadline per case; when a case hangs in a way the alarm cannot interrupt, or the child
dies (segfault, ``os._exit``, memory), the parent kills the whole child, marks that case failed and
starts a new child for the remaining cases. Timeouts follow the spec (docs/multiturn.md §5.1): each
timed-out case fails with ``TimeoutException``; once ``max_timeouts`` cases have timed out, the
remaining cases are marked failed without running (``skipped=True``). At the end the child's
whole process group is killed; in a pid namespace every process the code started dies with it.

Limits of the guarantee: the sandbox protects the host, not the integrity of the verdict against
code that deliberately tampers with the harness living in its own interpreter (results carry a
per-run nonce, which stops accidental or printed forgeries only). Files readable by ``nobody``
(world-readable files) stay readable. Without namespaces (``socket-block``), a process the code
starts with ``setsid`` is still killed by the supervisor's subreaper sweep, but a non-root parent
cannot hide its own ``/proc/<pid>/environ`` from code running under the same uid.

Why one file of this length: what is left is the parent half of one protocol (the job sent, the
records read back, their deadlines, restarts after a crash) and its entry points; split, a reader
would lose the state machine that the security argument above rests on. The child half is
``_sandbox_child.py``; turning test code into cases is ``cases.py`` (its names are re-exported here).
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from comlrl_lightning.envs.code.cases import extract_test_cases, test_setup_code

log = logging.getLogger(__name__)

_CHILD = Path(__file__).with_name("_sandbox_child.py")
NOBODY = 65534
_STARTUP_S = 15.0  # interpreter start + namespace setup; generous for loaded CI machines
_GRACE_S = 1.0  # parent deadline = child alarm + grace
_MAX_RECORD = 1 << 16  # a protocol line longer than this is garbage


class SandboxError(RuntimeError):
    """The sandbox itself could not run (not a failure of the code under test)."""


@dataclass(frozen=True)
class TestResult:
    """Outcome of one test case.

    ``case`` is the executed assert (``candidate`` already replaced by the entry point).
    ``error_type``/``error_message`` are set for failures, e.g. ``AssertionError`` /
    ``"expected 3, got 4"``, ``TimeoutException``, ``SystemExit``, ``MemoryError``, or
    ``SandboxCrash`` when the child died during the case.
    """

    __test__ = False  # not a pytest class

    index: int
    case: str
    passed: bool
    error_type: str | None = None
    error_message: str | None = None
    timed_out: bool = False
    skipped: bool = False
    duration_s: float = 0.0


# --------------------------------------------------------------------------------------------
# Isolation probe


@lru_cache(maxsize=1)
def isolation_info() -> dict:
    """What this machine gives the sandbox, measured once by running an empty job.

    Keys: ``isolation`` ("netns" or "socket-block"), ``netns``, ``pidns``, ``userns``, ``uid`` (of
    the code under test), ``privileges_dropped``, ``nproc_enforced``, ``socket_block``.
    """
    outcome = _run_child("", "", [], timeout_s=5.0, timeouts_left=1, options=_options({}))
    if outcome.info is None:
        raise SandboxError(f"sandbox probe failed: {outcome.crash}")
    return dict(outcome.info)


def isolation_level() -> str:
    """``"netns"``: private network (and pid) namespace; ``"socket-block"``: sockets blocked inside
    the interpreter only (no namespaces available to this process)."""
    return isolation_info()["isolation"]


# --------------------------------------------------------------------------------------------
# One child process


@dataclass
class _Outcome:
    info: dict | None = None
    results: list[TestResult] | None = None
    code_error: tuple[str, str, bool] | None = None  # (type, message, timed_out): the code failed
    crash: tuple[str, str, bool] | None = None  # (type, message, timed_out) for the next case
    ready: bool = False  # the code (and test setup) loaded; cases are running
    finished: bool = False  # the child reported "done"


def _options(kwargs: Mapping) -> dict:
    opts = {
        "memory_mb": 1024,
        "max_processes": 32,
        "max_file_mb": 16,
        "max_open_files": 64,
        "block_sockets": None,
        "namespaces": True,
        "sandbox_uid": NOBODY,
        "sandbox_gid": NOBODY,
        "python": None,
    }
    unknown = set(kwargs) - set(opts)
    if unknown:
        raise TypeError(f"unknown sandbox option(s) {sorted(unknown)}; allowed: {sorted(opts)}")
    opts.update(kwargs)
    return opts


def _minimal_env(workdir: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # before reaping: the pgid cannot be reused meanwhile
    except (ProcessLookupError, PermissionError):
        pass


def _rmtree(path: str) -> None:
    def retry(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


def _run_child(
    code: str,
    setup: str,
    cases: Sequence[tuple[int, str]],
    *,
    timeout_s: float,
    timeouts_left: int,
    options: dict,
) -> _Outcome:
    """Start one sandbox child for `cases` (a suffix of the job) and collect what it reports."""
    is_root = os.geteuid() == 0
    nonce = secrets.token_hex(16)
    cpu_s = math.ceil(timeout_s * (len(cases) + 1)) + 2
    job = {
        "nonce": nonce,
        "code": code,
        "setup": setup,
        "cases": list(cases),
        "timeout_s": float(timeout_s),
        "timeouts_left": int(timeouts_left),
        "block_sockets": options["block_sockets"],
        "namespaces": bool(options["namespaces"]),
        "drop_to": [options["sandbox_uid"], options["sandbox_gid"]] if is_root else None,
        "limits": {
            "memory_bytes": int(options["memory_mb"] * 2**20) if options["memory_mb"] else None,
            "cpu_s": cpu_s,
            "file_bytes": int(options["max_file_mb"] * 2**20) if options["max_file_mb"] is not None else None,
            "open_files": options["max_open_files"],
            "processes": options["max_processes"],
        },
    }
    workdir = tempfile.mkdtemp(prefix="comlrl-sandbox-")
    outcome = _Outcome(results=[])
    read_fd, write_fd = os.pipe()
    proc = None
    try:
        if is_root:
            os.chown(workdir, options["sandbox_uid"], options["sandbox_gid"])
        os.chmod(workdir, 0o700)
        python = options["python"] or sys.executable
        proc = subprocess.Popen(
            [python, "-I", "-S", "-B", str(_CHILD), str(write_fd)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=workdir,
            env=_minimal_env(workdir),
            pass_fds=(write_fd,),
            start_new_session=True,
        )
        os.close(write_fd)
        write_fd = -1
        try:
            proc.stdin.write(json.dumps(job).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        _collect(proc, read_fd, nonce, list(cases), timeout_s, outcome)
    finally:
        if proc is not None:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)  # supervisor kills its worker, then exits
                    proc.wait(timeout=5.0)
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    pass
            _kill_group(proc)
            proc.wait()
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
        _rmtree(workdir)
    return outcome


def _collect(proc, read_fd, nonce, cases, timeout_s, outcome: _Outcome) -> None:
    """Read the child's records until it exits; enforce the wall-clock deadlines."""
    prefix = nonce.encode() + b" "
    pending = list(cases)
    buffer = b""
    phase = "start"
    deadline = time.monotonic() + _STARTUP_S
    exit_record: dict | None = None
    while exit_record is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if phase == "end":
                return  # everything was reported; the child is slow to exit and gets killed
            if phase == "start":
                outcome.crash = ("SandboxError", "sandbox did not start in time", False)
            else:
                outcome.crash = ("TimeoutException", f"timed out after {timeout_s:g} s (killed)", True)
            return
        ready, _, _ = select.select([read_fd], [], [], min(remaining, 0.5))
        if not ready:
            continue
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            break  # every writer is gone without an exit record: the supervisor was killed
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if not line.startswith(prefix):
                continue  # not ours (forged or garbage): ignored
            try:
                record = json.loads(line[len(prefix) :])
            except ValueError:
                continue
            kind = record.get("t")
            now = time.monotonic()
            if kind == "setup":
                outcome.info = record["info"]
                phase, deadline = "code", now + 2 * timeout_s + _GRACE_S  # solution + test setup
            elif kind == "ready":
                outcome.ready = True
                phase, deadline = "cases", now + timeout_s + _GRACE_S
            elif kind == "code_error":
                outcome.code_error = (record["etype"], record["msg"], bool(record.get("timeout")))
                phase, deadline = "end", now + _STARTUP_S
            elif kind == "result":
                if not pending or record.get("i") != pending[0][0]:
                    continue
                index, case = pending.pop(0)
                outcome.results.append(
                    TestResult(
                        index=index,
                        case=case,
                        passed=bool(record["ok"]),
                        error_type=record.get("etype"),
                        error_message=record.get("msg"),
                        timed_out=bool(record.get("timeout")),
                        duration_s=float(record.get("dt", 0.0)),
                    )
                )
                deadline = now + timeout_s + _GRACE_S
            elif kind == "done":
                outcome.finished = True
                phase, deadline = "end", now + _STARTUP_S
            elif kind == "fatal":
                if outcome.info is None:
                    raise SandboxError(f"sandbox setup failed: {record.get('etype')}: {record.get('msg')}")
                outcome.crash = (record.get("etype", "SandboxCrash"), record.get("msg", ""), False)
                return
            elif kind == "exit":
                exit_record = record
        if len(buffer) > _MAX_RECORD:
            buffer = b""  # a flood on our pipe: drop it, the nonce check keeps us safe
    if outcome.finished or outcome.code_error is not None:
        return
    if exit_record is None:
        how = "the sandbox supervisor was killed"
    elif "signal" in exit_record:
        how = f"killed by {_signal_name(exit_record['signal'])}"
    else:
        how = f"exited with code {exit_record.get('code')}"
    if outcome.info is None:
        raise SandboxError(f"sandbox child died during setup ({how})")
    timed_out = exit_record is not None and exit_record.get("signal") == signal.SIGXCPU
    if timed_out:
        outcome.crash = ("TimeoutException", "CPU time limit exceeded", True)
    else:
        outcome.crash = ("SandboxCrash", f"the test process died: {how}", False)


# --------------------------------------------------------------------------------------------
# Public entry points


def run_cases(
    code: str,
    cases: Sequence[str],
    *,
    setup: str = "",
    timeout_s: float = 10.0,
    max_timeouts: int = 3,
    **options,
) -> list[TestResult]:
    """Run `code`, then `setup`, then each assert in `cases` in the sandbox; one result per case.

    A failure while running `code` or `setup` fails every case with that error (docs/multiturn.md §5.1).
    Options: ``memory_mb`` (1024), ``max_processes`` (32), ``max_file_mb`` (16),
    ``max_open_files`` (64), ``block_sockets`` (None = only without a network namespace),
    ``namespaces`` (True), ``sandbox_uid``/``sandbox_gid`` (65534, used when running as root),
    ``python`` (interpreter; default ``sys.executable``).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if max_timeouts < 1:
        raise ValueError(f"max_timeouts must be >= 1, got {max_timeouts!r}")
    opts = _options(options)
    cases = list(cases)
    results: list[TestResult | None] = [None] * len(cases)
    pending = list(range(len(cases)))
    timeouts = 0

    def fail_all(etype: str, msg: str, **extra) -> None:
        for i in pending:
            results[i] = TestResult(i, cases[i], False, etype, msg, **extra)
        pending.clear()

    while pending:
        if timeouts >= max_timeouts:
            fail_all("TimeoutException", f"skipped: {timeouts} test cases already timed out", skipped=True)
            break
        outcome = _run_child(
            code,
            setup,
            [(i, cases[i]) for i in pending],
            timeout_s=timeout_s,
            timeouts_left=max_timeouts - timeouts,
            options=opts,
        )
        for result in outcome.results:
            results[result.index] = result
            pending.remove(result.index)
            timeouts += result.timed_out
        if outcome.code_error is not None:
            etype, msg, timed_out = outcome.code_error
            fail_all(etype, msg, timed_out=timed_out)
        elif outcome.crash is not None and pending:
            etype, msg, timed_out = outcome.crash
            if not outcome.info:  # never got going: not the code's fault
                raise SandboxError(msg)
            if not outcome.ready:
                fail_all(etype, msg, timed_out=timed_out)  # died while loading the code
            else:
                i = pending.pop(0)
                results[i] = TestResult(i, cases[i], False, etype, msg, timed_out=timed_out)
                timeouts += timed_out
        elif not outcome.finished and pending:
            raise SandboxError("sandbox child stopped without reporting")
        # finished with cases pending: the child hit the timeout cap; the loop marks them skipped
    return [r for r in results if r is not None]


def run_tests(
    code: str,
    test_code: str,
    entry_point: str,
    *,
    timeout_s: float = 10.0,
    max_timeouts: int = 3,
    **options,
) -> list[TestResult]:
    """Run HumanEval-style `test_code` (a ``check(candidate)`` function) against `code`.

    The asserts of ``check`` become individual cases (:func:`extract_test_cases`); returns one
    :class:`TestResult` per case, in order (empty if no case was found). ``math`` is pre-imported
    for the code, as upstream does. See :func:`run_cases` for the options.
    """
    cases = extract_test_cases(test_code, entry_point)
    if not cases:
        return []
    return run_cases(
        code,
        cases,
        setup=test_setup_code(test_code),
        timeout_s=timeout_s,
        max_timeouts=max_timeouts,
        **options,
    )


def run_tests_many(
    jobs: Iterable[Mapping | Sequence],
    *,
    max_workers: int | None = None,
    **defaults,
) -> list[list[TestResult]]:
    """Run several :func:`run_tests` jobs in parallel, at most `max_workers` sandboxes at a time.

    Each job is a mapping with ``code``, ``test_code``, ``entry_point`` (plus optional per-job
    options) or a tuple ``(code, test_code, entry_point)``. `defaults` are options for every job.
    ``max_workers`` defaults to ``min(8, os.cpu_count())``. Results keep the job order.
    """
    normalized = []
    for job in jobs:
        if isinstance(job, Mapping):
            job = dict(job)
            args = (job.pop("code"), job.pop("test_code"), job.pop("entry_point"))
            normalized.append((args, {**defaults, **job}))
        else:
            normalized.append((tuple(job), dict(defaults)))
    if max_workers is None:
        max_workers = min(8, os.cpu_count() or 1)
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers!r}")
    if max_workers == 1 or len(normalized) <= 1:
        return [run_tests(*args, **kw) for args, kw in normalized]
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sandbox") as pool:
        futures = [pool.submit(run_tests, *args, **kw) for args, kw in normalized]
        return [f.result() for f in futures]
