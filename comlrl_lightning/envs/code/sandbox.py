"""Run model-written Python against HumanEval-style tests in a sandbox (design: ``docs/sandbox.md``).

Model code never runs in the calling process, nor in a process that decides a verdict. Each call
starts one sandbox (``isolation="bwrap"``, the default, needs the ``bwrap`` program of bubblewrap):

* new mount, pid, network, IPC and UTS namespaces; the host filesystem is invisible except the
  system directories and the interpreter's own installation prefix, mounted read-only, with the
  package directory hidden (a prefix that is or holds a home directory, or holds the caller's secrets,
  is refused); ``/tmp`` (the working directory) and ``/dev/shm`` are private size- and file-capped
  tmpfs mounts that vanish with the sandbox; ``/proc`` shows the sandbox's own processes only. No
  network at all: no interface but a down loopback, no host path sockets (they are not mounted);
* a seccomp filter (:func:`seccomp_program`): ``AF_UNIX`` sockets only, no keyring calls (the sandbox
  starts in a new, empty session keyring), no ``memfd_create``, no ``io_uring``;
* the code runs under its own uid: a random per-sandbox uid when the caller is root, otherwise the
  caller's uid mapped in a user namespace of its own (the kernel counts ``RLIMIT_NPROC`` per user
  namespace). Either way sandboxes cannot signal, read or starve each other;
* ``RLIMIT_AS`` per process plus a watchdog that kills the whole sandbox when the resident memory of
  all its processes, its tmpfs files and its SysV shared memory together pass ``memory_mb``, or its
  tmpfs mounts hold more than ``max_tmp_files`` files; ``RLIMIT_NPROC`` (``max_processes``, threads
  included), ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, no core dumps, no new privileges;
* ``--die-with-parent``: if the trainer dies, the sandbox and every process in it die too.

Inside, a trusted *judge* (pid 1, never runs model code) runs the test code; the model's functions
are proxies to a *worker* process that runs the model's code and answers each call with plain data
(exact builtin types, encoded as JSON). The comparisons happen in the judge, on values the model
cannot give a custom ``__eq__``; the tests never enter the worker, and the model's names never enter
the tests' namespace (the entry point's proxy aside; the prompt's helpers run judge-side). See
``_sandbox_child.py``.

Timeouts follow the spec (docs/multiturn.md §5.1): each timed-out case fails with ``TimeoutException``;
once ``max_timeouts`` cases have timed out, the remaining cases fail without running
(``skipped=True``). When the worker dies or hangs past its alarm, the case fails and a fresh sandbox
runs the remaining cases.

Without bubblewrap (or without user namespaces for a non-root caller) nothing safe is available and
the call raises :class:`SandboxError`, unless the caller opts into ``isolation="unsafe-subprocess"``:
a plain child process with rlimits, sockets blocked inside the interpreter and (as root) a
per-sandbox uid; no filesystem, network or process isolation worth the name.

Layout: this file is the parent half of one protocol (the job sent, the records read back with their
deadlines, restarts after a crash) and its entry points, kept together so that the state machine the
security argument above rests on reads in one place. What of the host a sandbox sees, the ``bwrap``
command line and the seccomp filter (stateless) are ``bwrap.py``; the judge/worker half is
``_sandbox_child.py``; turning test code into cases is ``cases.py``.
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

from comlrl_lightning.envs.code.bwrap import (
    INSIDE_CHILD,
    SandboxError,
    bwrap_command,
    bwrap_path,  # noqa: F401 - re-exported: callers check for bubblewrap through this module
    seccomp_program,
)
from comlrl_lightning.envs.code.cases import extract_test_cases, prompt_helpers, test_setup_code

log = logging.getLogger(__name__)

_CHILD = Path(__file__).with_name("_sandbox_child.py")
_UID_BASE, _UID_SPAN = 1 << 30, 1 << 24  # per-sandbox uids for root callers (random, no passwd entry)
_STARTUP_S = 15.0  # interpreter start + namespace setup; generous for loaded CI machines
_GRACE_S = 1.0  # parent deadline = judge deadline + grace
_MAX_RECORD = 1 << 16  # a protocol line longer than this is garbage
_ISOLATIONS = ("bwrap", "unsafe-subprocess")


@dataclass(frozen=True)
class TestResult:
    """Outcome of one test case.

    ``case`` is the executed assert (``candidate`` already replaced by the entry point).
    ``error_type``/``error_message`` are set for failures, e.g. ``AssertionError`` /
    ``"expected 3, got 4"``, ``TimeoutException``, ``SystemExit``, ``MemoryError``, or
    ``SandboxCrash`` when the model's process died during the case.
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


@lru_cache(maxsize=4)
def isolation_info(isolation: str = "bwrap") -> dict:
    """What the sandbox really enforces here, measured from inside by running an empty job.

    Keys: ``isolation`` (the mode), ``mount_ns``/``pid_ns``/``net_ns``/``user_ns`` (namespaces in
    force), ``fs_read_only`` and ``home_hidden`` (host filesystem), ``uid`` (of the code, as seen
    inside), ``privileges_dropped``, ``per_sandbox_uid`` (a uid or user namespace of its own),
    ``nproc_enforced``, ``socket_block``, ``memory_budget`` (how ``memory_mb`` is enforced), ``seccomp`` (the
    filter is in force), ``sockets_unix_only`` (creating an ``AF_INET``/``AF_INET6``/``AF_NETLINK``/``AF_PACKET``/
    ``AF_VSOCK`` socket fails), ``keyring_blocked`` (``keyctl`` fails), ``new_session_keyring`` (the sandbox
    left the caller's session keyring), ``memfd_blocked`` (``memfd_create`` fails).
    ``netns``/``pidns``/``userns`` are aliases. Raises :class:`SandboxError` when the mode cannot run.
    """
    outcome = _run_child("", "", [], timeout_s=5.0, timeouts_left=1, options=_options({"isolation": isolation}))
    if outcome.info is None:
        raise SandboxError(f"sandbox probe failed: {outcome.crash}")
    info = dict(outcome.info)
    info["isolation"] = isolation
    info.update(netns=info["net_ns"], pidns=info["pid_ns"], userns=info["user_ns"])
    info["per_sandbox_uid"] = bool(info["pid_ns"] and (info["user_ns"] or info["privileges_dropped"]))
    info["memory_budget"] = (
        "RLIMIT_AS per process + watchdog on the resident memory of "
        + ("every process of the pid namespace, the files of the private /tmp and /dev/shm and the SysV shared "
           "memory of the IPC namespace" if info["pid_ns"] else "the worker's process group")
    )
    info["seccomp"] = isolation == "bwrap" and seccomp_program() is not None
    return info


def unavailable_reason(isolation: str = "bwrap") -> str | None:
    """None when the sandbox can run in this mode here, else why not (the :class:`SandboxError` text)."""
    if sys.platform != "linux":
        return "the sandbox needs Linux"
    try:
        isolation_info(isolation)
    except SandboxError as exc:
        return str(exc)
    return None


def isolation_level() -> str:
    """The mode in force by default: ``"bwrap"`` (raises :class:`SandboxError` if unavailable)."""
    return isolation_info()["isolation"]


def require_sandbox(isolation: str = "bwrap", *, what: str = "the code environment") -> None:
    """Raise :class:`SandboxError` at construction, with the install command, when `what` could not run its
    sandbox here (instead of at the first rollout). ``isolation="unsafe-subprocess"`` needs nothing."""
    if isolation == "unsafe-subprocess":
        return
    reason = unavailable_reason(isolation)
    if reason is not None:
        raise SandboxError(f"{what} runs model code in a sandbox: {reason}")


# --------------------------------------------------------------------------------------------
# One sandbox


@dataclass
class _Outcome:
    info: dict | None = None
    results: list[TestResult] | None = None
    code_error: tuple[str, str, bool] | None = None  # (type, message, timed_out): the code failed
    crash: tuple[str, str, bool] | None = None  # (type, message, timed_out) for the next case
    ready: bool = False  # the code (and test setup) loaded; cases are running
    finished: bool = False  # the judge reported "done"
    restart: bool = False  # the worker died during a case; a fresh sandbox takes the rest
    stderr: str = ""


_DEFAULTS = {
    "memory_mb": 1024,
    "max_processes": 32,
    "max_file_mb": 16,
    "max_open_files": 64,
    "tmp_mb": 64,
    "max_tmp_files": 4096,
    "isolation": "bwrap",
    "python": None,
}


def _positive(name: str, value, *, integer: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if ok and integer and int(value) != value:
        ok = False
    if not ok:
        kind = "a positive integer" if integer else "a positive finite number"
        raise ValueError(f"sandbox option {name}={value!r} is not allowed: use {kind}")


def _options(kwargs: Mapping) -> dict:
    unknown = set(kwargs) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown sandbox option(s) {sorted(unknown)}; allowed: {sorted(_DEFAULTS)}")
    opts = {**_DEFAULTS, **kwargs}
    for name in ("memory_mb", "max_file_mb", "tmp_mb"):
        _positive(name, opts[name])
    for name in ("max_processes", "max_open_files", "max_tmp_files"):
        _positive(name, opts[name], integer=True)
    if opts["isolation"] not in _ISOLATIONS:
        raise ValueError(
            f"sandbox option isolation={opts['isolation']!r} is not allowed; use one of {list(_ISOLATIONS)}"
        )
    return opts


def _check_timeout(timeout_s) -> None:
    ok = isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool)
    if not (ok and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(
            f"timeout_s={timeout_s!r} is not allowed: use a positive finite number of seconds per test case"
        )


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


def _part(obj: dict) -> bytes:
    data = json.dumps(obj).encode()
    return f"{len(data):012d}".encode() + data


def _run_child(
    code: str,
    setup: str,
    cases: Sequence[tuple[int, str]],
    *,
    timeout_s: float,
    timeouts_left: int,
    options: dict,
    entry_point: str | None = None,
    helpers: str = "",
) -> _Outcome:
    """Start one sandbox for `cases` (a suffix of the job) and collect what its judge reports."""
    as_root = os.geteuid() == 0
    unsafe = options["isolation"] == "unsafe-subprocess"
    python = os.path.realpath(options["python"] or sys.executable)
    sandbox_uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if as_root else None
    cpu_s = math.ceil(timeout_s * (len(cases) + 2)) + 2
    part_a = {
        "code": code,
        "timeout_s": float(timeout_s),
        "block_sockets": unsafe,
        "probe": not cases,  # isolation_info(): the worker also tries what the seccomp filter refuses
        "drop_to": [sandbox_uid, sandbox_uid] if as_root else None,
        "limits": {
            "memory_bytes": int(options["memory_mb"] * 2**20),
            "cpu_s": cpu_s,
            "file_bytes": int(options["max_file_mb"] * 2**20),
            "open_files": int(options["max_open_files"]),
            "processes": int(options["max_processes"]),
            "tmp_files": int(options["max_tmp_files"]),
        },
    }
    part_b = {"setup": setup, "cases": list(cases), "timeout_s": float(timeout_s),
              "timeouts_left": int(timeouts_left), "entry_point": entry_point, "helpers": helpers}
    outcome = _Outcome(results=[])
    workdir = None
    read_fd, write_fd = os.pipe()
    filter_fd = -1
    proc = None
    try:
        if unsafe:
            workdir = tempfile.mkdtemp(prefix="comlrl-sandbox-")
            if as_root:
                os.chown(workdir, sandbox_uid, sandbox_uid)
            os.chmod(workdir, 0o700)
            cmd = [python, "-I", "-S", "-B", str(_CHILD), str(write_fd)]
            env, cwd = _minimal_env(workdir), workdir
        else:
            program = seccomp_program()
            if program is not None:
                filter_fd, filter_w = os.pipe()  # bwrap reads the filter to EOF; it fits the pipe's buffer
                os.write(filter_w, program)
                os.close(filter_w)
            cmd = bwrap_command(python, int(options["tmp_mb"] * 2**20), as_root, _CHILD,
                                filter_fd if program else None)
            cmd += [python, "-I", "-S", "-B", INSIDE_CHILD, str(write_fd)]
            env, cwd = _minimal_env("/tmp"), "/"
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            pass_fds=(write_fd,) if filter_fd < 0 else (write_fd, filter_fd),
            start_new_session=True,
        )
        os.close(write_fd)
        write_fd = -1
        if filter_fd >= 0:
            os.close(filter_fd)
            filter_fd = -1
        try:
            proc.stdin.write(_part(part_a) + _part(part_b))
            proc.stdin.close()
        except BrokenPipeError:
            pass
        _collect(proc, read_fd, list(cases), timeout_s, outcome)
    finally:
        if proc is not None:
            if proc.poll() is None:
                _kill_group(proc)  # bwrap: pid 1 of the namespace dies, and with it every process
            proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
        os.close(read_fd)
        for fd in (write_fd, filter_fd):
            if fd >= 0:
                os.close(fd)
        if workdir is not None:
            _rmtree(workdir)
    if outcome.info is None and outcome.crash is not None and outcome.crash[0] == "SandboxError":
        raise SandboxError(_setup_failure(options, outcome))
    return outcome


def _setup_failure(options: dict, outcome: _Outcome) -> str:
    detail = outcome.stderr.strip() or outcome.crash[1]
    if options["isolation"] == "bwrap":
        return (
            f"the bubblewrap sandbox could not start: {detail}. A non-root caller needs unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0; "
            "containers often need --security-opt seccomp=unconfined or running as root). To run model "
            "code without isolation anyway, pass isolation='unsafe-subprocess' (unsafe)."
        )
    return f"the sandbox could not start: {detail}"


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


def _collect(proc, read_fd, cases, timeout_s, outcome: _Outcome) -> None:
    """Read the judge's records until it exits; enforce the wall-clock deadlines."""
    pending = list(cases)
    buffer = b""
    err_fd = proc.stderr.fileno()
    fds = [read_fd, err_fd]
    phase = "start"
    deadline = time.monotonic() + _STARTUP_S
    while read_fd in fds:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if phase == "end":
                return  # everything was reported; the judge is slow to exit and gets killed
            if phase == "start":
                outcome.crash = ("SandboxError", "the sandbox did not start in time", False)
            else:
                outcome.crash = ("TimeoutException", f"timed out after {timeout_s:g} s (killed)", True)
            return
        ready, _, _ = select.select(fds, [], [], min(remaining, 0.5))
        if err_fd in ready:
            chunk = os.read(err_fd, 4096)
            if not chunk:
                fds.remove(err_fd)
            elif len(outcome.stderr) < 4096:
                outcome.stderr += chunk.decode(errors="replace")
        if read_fd not in ready:
            continue
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            break  # the judge is gone
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            try:
                record = json.loads(line)
            except ValueError:
                continue
            kind = record.get("t")
            now = time.monotonic()
            if kind == "setup":
                outcome.info = record["info"]
                phase, deadline = "code", now + 2 * timeout_s + 2 * _GRACE_S  # solution + test setup
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
            elif kind == "restart":
                outcome.restart = True
                phase, deadline = "end", now + _STARTUP_S
            elif kind == "done":
                outcome.finished = True
                phase, deadline = "end", now + _STARTUP_S
            elif kind == "fatal":
                outcome.crash = ("SandboxError", f"{record.get('etype')}: {record.get('msg')}", False)
                return
        if len(buffer) > _MAX_RECORD:
            buffer = b""
    if outcome.finished or outcome.restart or outcome.code_error is not None:
        return
    try:
        proc.wait(timeout=2.0)
        rest = os.read(err_fd, 4096) if err_fd in fds else b""
        outcome.stderr += rest.decode(errors="replace")
    except (subprocess.TimeoutExpired, OSError):
        pass
    how = f"exited with code {proc.returncode}" if proc.returncode is not None else "stopped"
    if outcome.info is None:
        outcome.crash = ("SandboxError", f"the sandbox {how} during setup", False)
    else:
        outcome.crash = ("SandboxCrash", f"the sandbox judge {how}", False)


# --------------------------------------------------------------------------------------------
# Public entry points


def run_cases(
    code: str,
    cases: Sequence[str],
    *,
    setup: str = "",
    entry_point: str | None = None,
    prompt: str | None = None,
    timeout_s: float = 10.0,
    max_timeouts: int = 3,
    **options,
) -> list[TestResult]:
    """Run `code`, then `setup`, then each assert in `cases` in the sandbox; one result per case.

    The cases run in a namespace of their own, outside the model's reach (docs/sandbox.md, "An isolated
    judge"): with `entry_point`, that function is the only name of the model's code they see; without it,
    every function of the model's code whose name is no builtin and not bound by trusted code. `prompt` (the
    problem's own text, trusted) gives the helpers a test calls (HumanEval's ``encode_shift``, ``poly``): they
    run on the judge's side, so the model's redefinitions of them are never what a test checks against.
    A failure while running `code` or `setup` fails every case with that error (docs/multiturn.md §5.1).
    Options: ``memory_mb`` (1024: all processes of the sandbox together), ``max_processes`` (32,
    threads included), ``max_file_mb`` (16: largest file), ``max_open_files`` (64), ``tmp_mb`` (64:
    size of the private ``/tmp`` and of ``/dev/shm``), ``isolation`` (``"bwrap"``, or
    ``"unsafe-subprocess"`` to run without isolation where bubblewrap cannot), ``python``
    (interpreter; default ``sys.executable``).
    """
    _check_timeout(timeout_s)
    if not isinstance(max_timeouts, int) or max_timeouts < 1:
        raise ValueError(f"max_timeouts must be >= 1, got {max_timeouts!r}")
    opts = _options(options)
    if entry_point is not None and not (isinstance(entry_point, str) and entry_point.isidentifier()):
        raise ValueError(f"entry_point={entry_point!r} is not allowed: use the name of the function under test")
    helpers = prompt_helpers(prompt or "", entry_point)
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
            entry_point=entry_point,
            helpers=helpers,
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
        elif outcome.restart:
            continue  # the worker died during a case (reported); a fresh sandbox takes the rest
        elif not outcome.finished and pending:
            raise SandboxError("sandbox child stopped without reporting")
        # finished with cases pending: the child hit the timeout cap; the loop marks them skipped
    return [r for r in results if r is not None]


def run_tests(
    code: str,
    test_code: str,
    entry_point: str,
    *,
    prompt: str | None = None,
    timeout_s: float = 10.0,
    max_timeouts: int = 3,
    **options,
) -> list[TestResult]:
    """Run HumanEval-style `test_code` (a ``check(candidate)`` function) against `code`.

    The asserts of ``check`` become individual cases (:func:`extract_test_cases`); returns one
    :class:`TestResult` per case, in order (empty if no case was found). ``math`` is pre-imported
    for the code, as upstream does. The tests see the model's `entry_point` only; pass the problem's `prompt`
    when they call a helper defined there (see :func:`run_cases`, also for the options).
    """
    _check_timeout(timeout_s)
    _options(options)
    cases = extract_test_cases(test_code, entry_point)
    if not cases:
        return []
    return run_cases(
        code,
        cases,
        setup=test_setup_code(test_code),
        entry_point=entry_point,
        prompt=prompt,
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

    Each job is a mapping with ``code``, ``test_code``, ``entry_point`` (plus optional ``prompt`` and per-job
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
