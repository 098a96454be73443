"""Bootstrap that runs *inside* the sandbox child process (see ``sandbox.py``).

Started as ``python -I -S -B _sandbox_child.py <result_fd>`` with a scrubbed environment, a fresh
session and a private temporary working directory. Standard library only; never imported by the
package. Process layout::

    parent (trainer) ── supervisor (this script; keeps the caller's uid)
                          └── worker (new pid/net namespaces when possible; unprivileged uid;
                                      rlimits; runs the model's code and the test cases)

The supervisor creates the namespaces, forks the worker and reports how it ended. The worker
reads nothing from the outside world after setup: the job (code, cases, limits, nonce) arrives on
stdin before any untrusted code runs. Every record sent back is one line ``<nonce> <json>`` on
the result pipe, so text printed by the model's code can never be mistaken for a result.

Why one self-contained file of this length: it runs in isolated mode (``-I``), where ``sys.path``
holds neither this file's folder nor the package, so a sibling module could not be imported; and
every file it needed would have to stay readable after the drop to an unprivileged uid. Supervisor
and worker share the setup code, so they stay together here.
"""

import ast
import builtins
import json
import os
import resource
import signal
import sys
import time

CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

# Imported before privileges are dropped: after setuid the interpreter's stdlib may not be readable
# any more (e.g. a Python installed under /root). A small base set plus every module the code or
# the tests import (found with ast, without running anything).
PRELOAD_BASE = [
    "math",
    "re",
    "collections",
    "itertools",
    "functools",
    "operator",
    "typing",
    "string",
    "heapq",
    "bisect",
]
PRELOAD_EXTRA = {"datetime": ["_strptime"], "time": ["_strptime"], "socket": ["encodings.idna"]}


def _modules_to_preload(*sources):
    names = list(PRELOAD_BASE)
    for source in sources:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.append(node.module)
                names += [f"{node.module}.{alias.name}" for alias in node.names]
    for name in list(names):
        names += PRELOAD_EXTRA.get(name.split(".")[0], [])
    return list(dict.fromkeys(names))


MAX_MESSAGE = 400
MAX_REPR = 200


class TimeoutException(BaseException):
    """Raised by the per-case alarm. A BaseException, so a bare `except Exception` can't swallow it."""


def _on_alarm(signum, frame):
    raise TimeoutException("test case timed out")


def _libc():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except Exception:  # noqa: BLE001 - no ctypes: run without namespaces
        return None


def _short(text, limit=MAX_MESSAGE):
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(exc):
    try:
        msg = str(exc)
    except BaseException:  # noqa: BLE001 - a user-defined __str__ may raise anything
        msg = "<unprintable message>"
    return type(exc).__name__, _short(msg)


def _safe_repr(value):
    try:
        return _short(repr(value), MAX_REPR)
    except BaseException:  # noqa: BLE001 - a user-defined __repr__ may raise anything
        return "<unrepresentable>"


class _CappedSink:
    """Replacement for sys.stdout/sys.stderr: keeps at most `limit` characters, drops the rest."""

    def __init__(self, limit):
        self.limit, self.size, self.parts = limit, 0, []

    def write(self, text):
        text = str(text)
        room = self.limit - self.size
        if room > 0:
            self.parts.append(text[:room])
            self.size += min(len(text), room)
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False


def _make_sender(fd, nonce, owner_pid):
    def send(record):
        if os.getpid() != owner_pid:  # a fork of the worker (model code called os.fork): stay silent
            os._exit(0)
        data = (nonce + " " + json.dumps(record) + "\n").encode()
        try:
            while data:
                data = data[os.write(fd, data) :]
        except OSError:
            os._exit(3)  # the model's code closed or broke our pipe: the parent reports a crash

    return send


def _stdlib_world_readable():
    """True when an unprivileged uid can import from the stdlib (no need to preload modules)."""
    import stat

    for directory in {os.path.dirname(os.__file__), os.path.dirname(json.__file__)}:
        path = os.path.realpath(directory)
        while True:
            try:
                mode = os.stat(path).st_mode
            except OSError:
                return False
            if not (mode & stat.S_IXOTH and mode & stat.S_IROTH):
                return False
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
    return True


def _set_limit(kind, value):
    try:
        resource.setrlimit(kind, (value, value))
        return True
    except (ValueError, OSError):
        return False


def _count_user_tasks(uid):
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                total += int(fields.get("Threads", "1"))
        except (OSError, ValueError, KeyError):
            continue
    return total


def _block_network():
    """Best-effort network block used when no network namespace could be created."""
    import _socket
    import socket

    def denied(*args, **kwargs):
        raise PermissionError(1, "network access is disabled in the sandbox")

    class BlockedSocket:
        def __new__(cls, *args, **kwargs):
            denied()

    for mod in (socket, _socket):
        for name in ("socket", "SocketType"):
            if hasattr(mod, name):
                setattr(mod, name, BlockedSocket)
        for name in ("create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"):
            if hasattr(mod, name):
                setattr(mod, name, denied)
    # Raw syscalls through ctypes would bypass the wrappers above; make ctypes unimportable.
    for name in list(sys.modules):
        if name == "ctypes" or name.startswith("ctypes.") or name == "_ctypes":
            del sys.modules[name]
    sys.modules["ctypes"] = None
    sys.modules["_ctypes"] = None


def _exec_timed(source, filename, env, timeout_s):
    """Run `source` in `env` under an alarm. Returns None on success, else (etype, msg, timed_out)."""
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            exec(compile(source, filename, "exec"), env)  # noqa: S102 - this process is the sandbox
        finally:
            # Disarm before any handler below runs: an alarm inside a handler would escape it.
            signal.setitimer(signal.ITIMER_REAL, 0)
    except TimeoutException:
        return "TimeoutException", f"timed out after {timeout_s:g} s", True
    except SystemExit as exc:
        return "SystemExit", _short(f"code called sys.exit({exc.code!r})"), False
    except BaseException as exc:  # noqa: BLE001 - every failure of the code is a test result
        etype, msg = _describe(exc)
        return etype, msg, False
    return None


def _case_source(src):
    """Rewrite `assert lhs == rhs` so that a failure message shows both values (each evaluated once)."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return src
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return src
    node = tree.body[0]
    test = node.test
    if node.msg is not None or not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return src
    if not isinstance(test.ops[0], ast.Eq):
        return src
    lhs = ast.get_source_segment(src, test.left)
    rhs = ast.get_source_segment(src, test.comparators[0])
    if lhs is None or rhs is None:
        return src
    return (
        f"__sandbox_got__ = ({lhs})\n__sandbox_want__ = ({rhs})\n"
        "if not (__sandbox_got__ == __sandbox_want__):\n"
        "    raise AssertionError('expected ' + __sandbox_repr__(__sandbox_want__)"
        " + ', got ' + __sandbox_repr__(__sandbox_got__))\n"
    )


def _children_of(my_pid):
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == my_pid:
                children.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return children


def _kill_children(in_pidns, budget_s=5.0):
    """Kill everything the code under test started, and reap it.

    As pid 1 of a private pid namespace, kill(-1) reaches every other process in it. Otherwise we
    are a child subreaper: descendants whose parents die are re-parented to us, so killing our
    children round after round reaches all of them, including those that called setsid().
    """
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no children left, alive or zombie
        if pid:
            continue
        try:
            if in_pidns:
                os.kill(-1, signal.SIGKILL)
            else:
                for child in _children_of(os.getpid()):
                    os.kill(child, signal.SIGKILL)
        except OSError:
            pass
        time.sleep(0.001)


def worker(job, send, info, libc):
    os.setpgid(0, 0)  # own process group, killed as a whole by the supervisor at the end
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.close(devnull)

    drop_to = job["drop_to"]  # (uid, gid) when started as root, else None
    if drop_to is not None and not _stdlib_world_readable():
        for name in _modules_to_preload(
            job["code"], job["setup"], *(src for _, src in job["cases"] if "import" in src)
        ):
            try:
                __import__(name)
            except BaseException:  # noqa: BLE001, S110 - `from os import path` names no module
                pass

    limits = job["limits"]
    _set_limit(resource.RLIMIT_CORE, 0)
    if limits.get("memory_bytes"):
        _set_limit(resource.RLIMIT_AS, limits["memory_bytes"])
    if limits.get("cpu_s"):
        resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    if limits.get("file_bytes") is not None:
        _set_limit(resource.RLIMIT_FSIZE, limits["file_bytes"])
    if limits.get("open_files"):
        _set_limit(resource.RLIMIT_NOFILE, limits["open_files"])
    nproc = limits.get("processes")
    if nproc:
        # RLIMIT_NPROC counts every task of the real uid, so without a dedicated uid the budget
        # must sit on top of what that user already runs.
        if drop_to is None and not info["userns"]:
            nproc += job["user_tasks"]
        info["nproc_limit"] = nproc if _set_limit(resource.RLIMIT_NPROC, nproc) else None

    block = job["block_sockets"]
    if block is None:
        block = not info["netns"]
    if block:
        _block_network()  # before setuid: it imports extension modules
    info["socket_block"] = bool(block)

    if drop_to is not None:
        uid, gid = drop_to
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    info["uid"] = os.getuid()
    info["privileges_dropped"] = os.getuid() != 0 and drop_to is not None
    info["nproc_enforced"] = bool(info.get("nproc_limit")) and os.getuid() != 0
    if libc is not None:
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid: setuid clears it
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc = None
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writing past RLIMIT_FSIZE -> OSError, not death
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    send({"t": "setup", "info": info})

    timeout_s = job["timeout_s"]
    cases = job["cases"]
    code, setup = job["code"], job["setup"]
    timeouts_left = job["timeouts_left"]
    in_pidns = info["pidns"] and os.getpid() == 1
    info = None
    del job
    sink_limit = 1 << 16
    sys.stdout = _CappedSink(sink_limit)
    sys.stderr = _CappedSink(sink_limit)

    env = {"__name__": "__sandbox__", "__builtins__": builtins}
    exec("import math", env)  # noqa: S102 - upstream pre-seeds math
    for source, filename in ((code, "<solution>"), (setup, "<test setup>")):
        if not source.strip():
            continue
        failure = _exec_timed(source, filename, env, timeout_s)
        if failure is not None:
            _kill_children(in_pidns)
            etype, msg, timed_out = failure
            send({"t": "code_error", "etype": etype, "msg": msg, "timeout": timed_out, "where": filename})
            os._exit(0)
    _kill_children(in_pidns)
    send({"t": "ready"})

    for index, src in cases:
        if timeouts_left <= 0:
            break
        sys.stdout = _CappedSink(sink_limit)
        sys.stderr = _CappedSink(sink_limit)
        env["__sandbox_repr__"] = _safe_repr
        start = time.perf_counter()
        failure = _exec_timed(_case_source(src), f"<test {index}>", env, timeout_s)
        elapsed = time.perf_counter() - start
        _kill_children(in_pidns)
        if failure is None:
            send({"t": "result", "i": index, "ok": True, "dt": elapsed})
        else:
            etype, msg, timed_out = failure
            timeouts_left -= timed_out
            send(
                {
                    "t": "result",
                    "i": index,
                    "ok": False,
                    "etype": etype,
                    "msg": msg,
                    "timeout": timed_out,
                    "dt": elapsed,
                }
            )
    send({"t": "done"})
    os._exit(0)


def main():
    result_fd = int(sys.argv[1])
    job = json.loads(sys.stdin.buffer.read().decode())
    nonce = job.pop("nonce")
    libc = _libc()
    # Counted before any user namespace exists (inside one, every outside uid reads as nobody).
    job["user_tasks"] = _count_user_tasks(os.getuid()) if os.getuid() != 0 else 0
    info = {"netns": False, "pidns": False, "userns": False}
    want = job.get("namespaces", True)
    if want and libc is not None:
        # Root creates the namespaces directly and drops to an unprivileged uid later. Anyone else
        # needs a user namespace; root never uses one, because inside it the process would keep
        # the real uid 0 for file permission checks.
        flags = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC
        if os.getuid() != 0:
            flags |= CLONE_NEWUSER
        if libc.unshare(flags) == 0:
            info.update(netns=True, pidns=True, userns=bool(flags & CLONE_NEWUSER))
    if libc is not None:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    info["isolation"] = "netns" if info["netns"] else "socket-block"

    pid = os.fork()
    if pid == 0:
        try:
            worker(job, _make_sender(result_fd, nonce, os.getpid()), info, libc)
        except BaseException as exc:  # noqa: BLE001 - bootstrap failure, reported to the parent
            etype, msg = _describe(exc)
            try:
                os.write(
                    result_fd,
                    (nonce + " " + json.dumps({"t": "fatal", "etype": etype, "msg": msg}) + "\n").encode(),
                )
            finally:
                os._exit(4)
        os._exit(0)

    del job
    reaped = False

    def on_term(signum, frame):  # the parent aborts: kill the worker (never a reaped, reusable pid)
        if not reaped:
            os.kill(pid, signal.SIGKILL)

    signal.signal(signal.SIGTERM, on_term)
    while True:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            break
        except ChildProcessError:
            break
    try:
        os.killpg(pid, signal.SIGKILL)  # the worker's group, while its zombie still holds the pgid
    except OSError:
        pass
    _, status = os.waitpid(pid, 0)
    reaped = True
    _kill_children(in_pidns=False)  # anything that left the group (setsid) was re-parented to us
    record = {"t": "exit"}
    if os.WIFSIGNALED(status):
        record["signal"] = os.WTERMSIG(status)
    else:
        record["code"] = os.WEXITSTATUS(status)
    os.write(result_fd, (nonce + " " + json.dumps(record) + "\n").encode())
    os._exit(0)


if __name__ == "__main__":
    main()
