"""Bootstrap that runs *inside* the sandbox (see ``sandbox.py`` and ``docs/sandbox.md``).

Started as ``python -I -S -B _sandbox_child.py <result_fd>`` (under bubblewrap, as pid 1 of a
fresh pid namespace; or as a plain subprocess in the ``unsafe-subprocess`` mode). Standard library
only; never imported by the package. Process layout::

    trainer ── judge (this script, pid 1: trusted; runs the *test* code, never the model's)
                 └── worker (forked before the judge reads any test; drops to the sandbox uid;
                             rlimits; runs the model's code and answers calls with plain data)

stdin carries two length-prefixed JSON parts. The judge reads part A (the model's code, limits),
forks the worker, and only then reads part B (test setup and cases): the worker's memory never held
a test. The judge runs each case in a namespace of its own: the original builtins, ``math``, the problem
prompt's helpers (trusted, run here) and a proxy for the model's entry point, nothing else of the model's; the
proxy sends the arguments to the worker as plain data and gets back plain data (or an exception name and
message; a remote ``StopIteration`` comes back as no StopIteration).
Only exact builtin types cross (``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``,
``bytes``, ``list``, ``tuple``, ``dict``, ``set``, ``frozenset``), so the comparisons of a case run
on values whose ``__eq__`` the model cannot choose, in a process it cannot reach: the judge is
non-dumpable (no ptrace, no ``/proc/1/mem`` or ``/proc/1/fd``), and as pid 1 of the namespace it
ignores every signal it has no handler for, SIGKILL included. Records for the trainer go out on
``result_fd``, which the worker closes before running anything. While it waits for the worker, the judge
is also the sandbox's watchdog: resident memory, tmpfs files and SysV shared memory against ``memory_mb``,
files against ``max_tmp_files``, processes against ``max_processes``.

Why one self-contained file, and why it is longer than the package's 650-line rule: it runs in isolated
mode (``-I``), where ``sys.path`` holds neither this file's folder nor the package, and the package
directory is hidden inside the sandbox, where this file alone is mounted (read-only, at
``bwrap.INSIDE_CHILD``). So it can import no sibling module: the judge, the worker, the value codec and the
watchdog must travel as this one file (each with its own section below), and splitting it would mean
mounting and path-hacking more files into the sandbox.
"""

import ast
import builtins
import json
import os
import resource
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

MAX_MESSAGE = 400
MAX_REPR = 200
MAX_VALUE_BYTES = 1 << 20  # one encoded value (a result or the arguments of one call)
MAX_DEPTH = 64
POLL_S = 0.02  # memory watchdog period while the judge waits for the worker
REPLY_GRACE_S = 0.25  # the worker's own alarm fires first; this is how long we wait on top
FLUSH_S = 0.05  # results to the trainer are batched this long at most (its deadlines allow 1 s more)

# Imported before privileges are dropped: after setuid the interpreter's stdlib may not be readable
# any more. A small base set plus every module the code imports (found with ast, nothing run).
PRELOAD_BASE = ["math", "re", "collections", "itertools", "functools", "operator", "typing", "string",
                "heapq", "bisect"]
PRELOAD_EXTRA = {"datetime": ["_strptime"], "time": ["_strptime"], "socket": ["encodings.idna"]}


class TimeoutException(BaseException):
    """Raised by the per-case alarm. A BaseException, so a bare `except Exception` can't swallow it."""


class WorkerGone(BaseException):
    """The worker died or had to be killed; the sandbox restarts for the remaining cases."""

    def __init__(self, etype, msg, timed_out=False):
        super().__init__(msg)
        self.etype, self.msg, self.timed_out = etype, msg, timed_out


PRISTINE_BUILTINS = dict(vars(builtins))  # taken before anything ran; the judge's tests see these


def _on_alarm(signum, frame):
    raise TimeoutException("test case timed out")


def _libc():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except Exception:  # noqa: BLE001 - no ctypes: no prctl
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
    except BaseException:  # noqa: BLE001
        return "<unrepresentable>"


class _CappedSink:
    """Replacement for sys.stdout/sys.stderr: keeps at most `limit` characters, drops the rest."""

    def __init__(self, limit=1 << 16):
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


# ----------------------------------------------------------------------------------------------
# Plain data across the boundary


class NotPlain(TypeError):
    pass


def encode(value, depth=0):
    """A JSON-able tree for an exact builtin value; NotPlain for anything else (subclasses too)."""
    if depth > MAX_DEPTH:
        raise NotPlain("value nested too deeply")
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:
        return value if -(2**53) < value < 2**53 else {"i": str(value)}
    if t is float:
        return {"f": repr(value)}
    if t is complex:
        return {"c": [repr(value.real), repr(value.imag)]}
    if t is bytes:
        return {"y": value.hex()}
    if t is list or t is tuple or t is set or t is frozenset:
        tag = {list: "l", tuple: "t", set: "s", frozenset: "z"}[t]
        return {tag: [encode(v, depth + 1) for v in value]}
    if t is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    raise NotPlain(f"a value of type {t.__name__} cannot leave the sandbox (only builtin data types)")


def decode(tree, depth=0):
    """Inverse of :func:`encode`; ValueError on anything it would not produce."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if tree is None or type(tree) in (bool, str, int):
        return tree
    if type(tree) is dict and len(tree) == 1:
        (tag, body), = tree.items()
        if tag == "i" and type(body) is str:
            return int(body)
        if tag == "f" and type(body) is str:
            return float(body)
        if tag == "c" and type(body) is list and len(body) == 2:
            return complex(float(body[0]), float(body[1]))
        if tag == "y" and type(body) is str:
            return bytes.fromhex(body)
        if tag in ("l", "t", "s", "z") and type(body) is list:
            items = [decode(v, depth + 1) for v in body]
            return {"l": list, "t": tuple, "s": set, "z": frozenset}[tag](items)
        if tag == "d" and type(body) is list:
            out = {}
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError("bad dict item")
                out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
            return out
    raise ValueError("not an encoded value")


class _Channel:
    """Line-delimited JSON over a pair of pipe fds, with a size cap on every line."""

    def __init__(self, rfd, wfd):
        self.rfd, self.wfd, self.buffer = rfd, wfd, b""
        self.pending, self.flushed = [], time.monotonic()

    def send(self, obj, *, batch=False):
        """Write one record; with `batch`, hold it back for up to FLUSH_S (one write per many cases:
        every pipe write wakes the reader, which is most of the cost of a fast case)."""
        self.pending.append(json.dumps(obj) + "\n")
        now = time.monotonic()
        if batch and now - self.flushed < FLUSH_S:
            return
        data, self.pending, self.flushed = "".join(self.pending).encode(), [], now
        while data:
            data = data[os.write(self.wfd, data):]

    def pending_line(self):
        return b"\n" in self.buffer

    def read_line(self):
        """One line if complete; None if more bytes are needed; EOFError when closed."""
        while b"\n" not in self.buffer:
            chunk = os.read(self.rfd, 1 << 16)
            if not chunk:
                raise EOFError
            self.buffer += chunk
            if len(self.buffer) > 2 * MAX_VALUE_BYTES:
                raise ValueError("message too large")
            if b"\n" not in self.buffer:
                return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


def _read_part(fd):
    """One length-prefixed part of the job from stdin, read exactly (nothing beyond it)."""
    def exact(n):
        data = b""
        while len(data) < n:
            chunk = os.read(fd, n - len(data))
            if not chunk:
                raise EOFError("job truncated")
            data += chunk
        return data

    size = int(exact(12).decode())
    return json.loads(exact(size).decode())


# ----------------------------------------------------------------------------------------------
# Worker: runs the model's code


def _modules_to_preload(source):
    names = list(PRELOAD_BASE)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    for name in list(names):
        names += PRELOAD_EXTRA.get(name.split(".")[0], [])
    return list(dict.fromkeys(names))


def _stdlib_world_readable():
    import stat

    path = os.path.realpath(os.path.dirname(os.__file__))
    while True:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return False
        if not (mode & stat.S_IXOTH and mode & stat.S_IROTH):
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def _set_limit(kind, value):
    try:
        resource.setrlimit(kind, (value, value))
        return True
    except (ValueError, OSError):
        return False


def _block_network():
    """unsafe-subprocess only: sockets blocked inside the interpreter (best effort)."""
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
    for name in list(sys.modules):
        if name in ("ctypes", "_ctypes") or name.startswith("ctypes."):
            del sys.modules[name]
    sys.modules["ctypes"] = None
    sys.modules["_ctypes"] = None


def _children_of(my_pid):
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stat = fh.read()
                if int(stat[stat.rindex(")") + 2:].split()[1]) == my_pid:
                    children.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return children


def _kill_children(in_pidns, budget_s=5.0):
    """Kill and reap everything this process started. In a pid namespace kill(-1) reaches every
    process but us and pid 1; otherwise we are a subreaper and kill our children round by round."""
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
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


KEYCTL = {"x86_64": 250, "aarch64": 219}  # syscall numbers (keyutils is not part of the C library)
KEYCTL_GET_KEYRING_ID, KEYCTL_JOIN_SESSION_KEYRING, KEY_SPEC_SESSION_KEYRING = 0, 1, -3


def _keyctl(libc, *args):
    import ctypes

    number = KEYCTL.get(os.uname().machine)
    if libc is None or number is None:
        return None
    return libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args))


def _join_new_session_keyring(libc):
    """Leave the caller's session keyring for a new, empty, anonymous one (the trainer's keys are out of reach
    even where the seccomp filter that refuses keyctl to the model is not in force)."""
    try:
        return (_keyctl(libc, KEYCTL_JOIN_SESSION_KEYRING, 0) or -1) > 0
    except Exception:  # noqa: BLE001 - no ctypes: nothing joined
        return False


def _measure(info):
    """What is really in force, seen from inside (reported by isolation_info())."""
    try:
        with open("/proc/net/dev") as fh:
            interfaces = [line.split(":")[0].strip() for line in fh.readlines()[2:]]
        info["net_ns"] = interfaces == ["lo"]
    except OSError:
        info["net_ns"] = False
    try:
        with open("/proc/self/uid_map") as fh:
            info["user_ns"] = fh.read().split() != ["0", "0", "4294967295"]
    except OSError:
        info["user_ns"] = False
    info["uid"] = os.getuid()
    info["fs_read_only"] = not os.access("/usr", os.W_OK) and not os.access("/", os.W_OK)
    info["home_hidden"] = not any(os.path.exists(p) for p in ("/home", "/root/.ssh", "/run/user"))


def _probe(info, libc, socket):
    """isolation_info() only: what the seccomp filter refuses, tried from the worker."""
    refused = []
    for name in ("AF_INET", "AF_INET6", "AF_NETLINK", "AF_PACKET", "AF_VSOCK"):
        family = getattr(socket, name, None)
        if family is None:
            continue
        try:
            socket.socket(family, socket.SOCK_DGRAM if name != "AF_PACKET" else socket.SOCK_RAW).close()
        except OSError as exc:
            refused.append(exc.errno == 97)  # EAFNOSUPPORT: the seccomp filter's answer
    try:
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()  # the one family that stays
    except OSError:
        refused.append(False)
    info["sockets_unix_only"] = bool(refused) and all(refused)
    try:
        info["keyring_blocked"] = _keyctl(libc, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0) == -1
    except Exception:  # noqa: BLE001
        info["keyring_blocked"] = False
    try:
        os.close(os.memfd_create("probe"))
        info["memfd_blocked"] = False
    except OSError:
        info["memfd_blocked"] = True


def worker(part, channel, info, libc, in_pidns):
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    keep = {0, 1, 2, channel.rfd, channel.wfd}
    for fd in range(3, 256):  # the trainer's result pipe and the rest of stdin: gone before any code
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    os.setpgid(0, 0)
    drop_to = part["drop_to"]
    if drop_to is not None and not _stdlib_world_readable():
        for name in _modules_to_preload(part["code"]):
            try:
                __import__(name)
            except BaseException:  # noqa: BLE001, S110
                pass

    socket_module = None
    if part.get("probe"):
        import socket as socket_module  # before the uid drop (the stdlib may not be readable after it)
    limits = part["limits"]
    _set_limit(resource.RLIMIT_CORE, 0)
    _set_limit(resource.RLIMIT_AS, limits["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    _set_limit(resource.RLIMIT_FSIZE, limits["file_bytes"])
    _set_limit(resource.RLIMIT_NOFILE, limits["open_files"])
    info["nproc_limit"] = limits["processes"] if _set_limit(resource.RLIMIT_NPROC, limits["processes"]) else None
    info["socket_block"] = bool(part["block_sockets"])
    if part["block_sockets"]:
        _block_network()  # before setuid: it imports extension modules
    if drop_to is not None:
        uid, gid = drop_to
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    if libc is not None:
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid: setuid clears it
        if not in_pidns:
            libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if part.get("probe"):
        _probe(info, libc, socket_module)
    libc = None
    _measure(info)
    info["privileges_dropped"] = os.getuid() != 0
    # Root ignores RLIMIT_NPROC; in a user namespace the count is per namespace, else per real uid.
    info["nproc_enforced"] = bool(info["nproc_limit"]) and os.getuid() != 0 and (
        drop_to is not None or info["user_ns"])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writing past RLIMIT_FSIZE -> OSError, not death
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    channel.send({"setup": info})
    code, timeout_s = part["code"], part["timeout_s"]
    del part, info
    sys.stdout, sys.stderr = _CappedSink(), _CappedSink()
    env = {"__name__": "__sandbox__", "__builtins__": builtins}
    exec("import math", env)  # noqa: S102 - upstream pre-seeds math
    me = os.getpid()
    failure = _call_timed(lambda: exec(compile(code, "<solution>", "exec"), env), timeout_s)  # noqa: S102
    if os.getpid() != me:
        os._exit(0)
    _kill_children(in_pidns)
    if failure is not None:
        channel.send({"load_error": failure})
        os._exit(0)
    plain = (type(_describe), type(len))
    names = sorted(k for k, v in env.items() if isinstance(v, plain) and not k.startswith("__"))
    channel.send({"loaded": names})
    while True:
        try:
            line = channel.read_line()
            while line is None:
                line = channel.read_line()
        except (EOFError, OSError, ValueError):
            os._exit(0)
        request = json.loads(line)
        sys.stdout, sys.stderr = _CappedSink(), _CappedSink()
        outcome = {}

        def call(request=request, outcome=outcome):
            func = env.get(request["f"])
            if func is None:
                raise NameError(f"name {request['f']!r} is not defined")
            result = func(*decode(request["a"]), **decode(request["k"]))
            try:
                outcome["r"] = encode(result)
            except NotPlain as exc:
                raise TypeError(f"the result cannot be checked: {exc}") from None

        failure = _call_timed(call, max(request["t"], 0.001))
        if os.getpid() != me:  # a fork of the worker (the code called os.fork) returned: stay silent
            os._exit(0)
        _kill_children(in_pidns)
        if failure is None:
            reply = {"r": outcome["r"]}
        elif failure[2]:
            reply = {"x": failure[1]}
        else:
            reply = {"e": failure[:2]}
        try:
            channel.send(reply if len(json.dumps(reply)) <= MAX_VALUE_BYTES else
                         {"e": ["ValueError", "the result is too large to leave the sandbox"]})
        except OSError:
            os._exit(3)


def _call_timed(func, timeout_s):
    """Run func under an alarm. None on success, else [etype, msg, timed_out]."""
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            func()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except TimeoutException:
        return ["TimeoutException", f"timed out after {timeout_s:g} s", True]
    except SystemExit as exc:
        return ["SystemExit", _short(f"code called sys.exit({exc.code!r})"), False]
    except BaseException as exc:  # noqa: BLE001 - every failure of the code is a test result
        etype, msg = _describe(exc)
        return [etype, msg, False]
    return None


# ----------------------------------------------------------------------------------------------
# Judge: runs the trusted test code against proxies


def _case_source(src):
    """Rewrite `assert lhs == rhs` so that a failure shows both values (each evaluated once)."""
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


# Exceptions that steer the judge's own control flow when raised inside test code: a StopIteration out of a
# proxy would end a test's map() or next() loop early (fewer values checked) instead of failing the case.
FLOW_EXCEPTIONS = ("StopIteration", "StopAsyncIteration")


def _remote_exception(etype, msg):
    """The exception the judge raises for a failure reported by the worker: the builtin class of that name for
    ordinary errors (tests may expect a ValueError), a fresh class for anything else, and a fresh class that is
    no StopIteration for the flow-control names (:data:`FLOW_EXCEPTIONS`)."""
    cls = getattr(builtins, etype, None) if etype.isidentifier() and etype not in FLOW_EXCEPTIONS else None
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        name = etype if etype.isidentifier() else "RemoteError"
        cls = type(name, (Exception,), {})
    try:
        return cls(msg)
    except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError needs 5 arguments
        return type(etype if etype.isidentifier() else "RemoteError", (Exception,), {})(msg)


SHM_INFO, MSG_INFO = 14, 12


def _sysv_bytes(libc, page):
    """Bytes held by the SysV shared memory segments and message queues of this IPC namespace (the sandbox's
    own: bwrap unshares IPC). Segments outlive their processes, so the count is per namespace, not per pid.
    Two system calls (``shmctl(SHM_INFO)``: pages of every segment; ``msgctl(MSG_INFO)``: bytes queued); the
    ``/proc/sysvipc`` files, twenty times slower to read, only without ctypes."""
    if libc is not None:
        import ctypes

        buf = ctypes.create_string_buffer(64)
        total = 0
        if libc.shmctl(0, SHM_INFO, buf) >= 0:
            total += ctypes.c_ulong.from_buffer(buf, 8).value * page  # struct shm_info.shm_tot
        if libc.msgctl(0, MSG_INFO, buf) >= 0:
            total += ctypes.c_int.from_buffer(buf, 24).value  # struct msginfo.msgtql
        return total
    total = 0
    for path, column in (("/proc/sysvipc/shm", "size"), ("/proc/sysvipc/msg", "cbytes")):
        try:
            with open(path) as fh:
                header = fh.readline().split()
                index = header.index(column)
                for line in fh:
                    fields = line.split()
                    if len(fields) > index:
                        total += int(fields[index])
        except (OSError, ValueError):
            continue
    return total


class Judge:
    def __init__(self, worker_pid, channel, limits, in_pidns, libc=None):
        self.worker_pid, self.channel, self.libc = worker_pid, channel, libc
        self.memory_bytes, self.in_pidns = limits["memory_bytes"], in_pidns
        self.max_processes, self.max_tmp_files = limits["processes"], limits.get("tmp_files")
        self.tmpfs = ["/tmp", "/dev/shm"] if in_pidns else []  # private mounts (bwrap); the host's otherwise
        self.deadline = None
        self.page = os.sysconf("SC_PAGE_SIZE")

    def over_budget(self):
        """None, or (etype, message) for the first limit the sandbox passed: its memory (resident memory of every
        process + the files of its private tmpfs mounts + its SysV shared memory and message queues), the number
        of files in those mounts (``max_tmp_files``: each costs kernel memory the size cap does not see), or the
        number of processes."""
        pids = self._sandbox_pids()
        if self.in_pidns and len(pids) > self.max_processes + 1:  # +1: a child mid-exec of a fork is fine
            return "BlockingIOError", f"the sandbox started more than max_processes={self.max_processes} processes"
        used, files = self.memory_in_use(pids), 0
        for path in self.tmpfs:
            try:
                st = os.statvfs(path)
            except OSError:
                continue
            used += (st.f_blocks - st.f_bfree) * st.f_frsize
            files += st.f_files - st.f_ffree
        if self.in_pidns:
            used += _sysv_bytes(self.libc, self.page)
        if used > self.memory_bytes:
            return "MemoryError", (f"the sandbox exceeded its memory budget of {self.memory_bytes >> 20} MB (all "
                                   "processes, /tmp, /dev/shm and shared memory together)")
        if self.max_tmp_files is not None and files > self.max_tmp_files + 2 * len(self.tmpfs):  # + the roots
            return "OSError", (f"the sandbox created more than max_tmp_files={self.max_tmp_files} files in /tmp and "
                               "/dev/shm")
        return None

    def _sandbox_pids(self):
        if self.in_pidns:
            return [int(p) for p in os.listdir("/proc") if p.isdigit() and p != "1"]
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getpgid(int(entry)) == self.worker_pid:
                        pids.append(int(entry))
                except OSError:
                    pass
        return pids

    def memory_in_use(self, pids=None):
        total = 0
        for pid in self._sandbox_pids() if pids is None else pids:
            try:
                with open(f"/proc/{pid}/statm") as fh:
                    total += int(fh.read().split()[1]) * self.page
            except (OSError, ValueError, IndexError):
                pass
        return total

    def kill_all(self):
        """Every process of the sandbox but this one (the worker included)."""
        if self.in_pidns:
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        else:
            try:
                os.killpg(self.worker_pid, signal.SIGKILL)
            except OSError:
                pass
            _kill_children(False)
        _reap()

    def worker_died(self):
        try:
            pid, status = os.waitpid(self.worker_pid, 0)
        except ChildProcessError:
            return "the test process died"
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            if number == signal.SIGXCPU:
                return None
            try:
                name = signal.Signals(number).name
            except ValueError:
                name = f"signal {number}"
            return f"the test process died: killed by {name}"
        return f"the test process died: exited with code {os.WEXITSTATUS(status)}"

    def wait_reply(self, what):
        """The worker's next message, watching memory and the case deadline meanwhile."""
        import select

        while True:
            try:
                line = self.channel.read_line() if self.channel.pending_line() else None
                if line is None:
                    remaining = self.deadline - time.monotonic()
                    if remaining <= 0:
                        self.kill_all()
                        raise WorkerGone("TimeoutException", f"{what} timed out (killed)", True)
                    ready, _, _ = select.select([self.channel.rfd], [], [], min(POLL_S, remaining))
                    if ready:
                        line = self.channel.read_line()
                    if line is None:
                        over = self.over_budget()
                        if over is not None:
                            self.kill_all()
                            raise WorkerGone(*over)
                        continue
                message = json.loads(line)
                if type(message) is not dict or len(message) != 1:
                    raise ValueError("malformed message from the test process")
                over = self.over_budget()  # also when the reply came before any poll: the limits never depend
                if over is not None:  # on how fast the case ran
                    self.kill_all()
                    raise WorkerGone(*over)
                return message
            except (EOFError, OSError, ValueError) as exc:
                how = self.worker_died() if isinstance(exc, EOFError) else f"protocol error: {exc}"
                self.kill_all()
                if how is None:
                    raise WorkerGone("TimeoutException", "CPU time limit exceeded", True) from None
                raise WorkerGone("SandboxCrash", how) from None

    def proxy(self, name):
        judge = self

        def remote(*args, **kwargs):
            try:
                payload = {"f": name, "a": encode(list(args)), "k": encode(dict(kwargs))}
            except NotPlain as exc:
                raise TypeError(f"cannot pass this argument into the sandbox: {exc}") from None
            payload["t"] = max(judge.deadline - REPLY_GRACE_S - time.monotonic(), 0.001)
            if len(json.dumps(payload)) > MAX_VALUE_BYTES:
                raise ValueError("the arguments are too large to pass into the sandbox")
            try:
                judge.channel.send(payload)
            except OSError:
                how = judge.worker_died() or "CPU time limit exceeded"
                judge.kill_all()
                raise WorkerGone("SandboxCrash", how) from None
            try:
                reply = judge.wait_reply("test case")
            except TimeoutException:  # the judge's alarm, while the worker still runs the call
                judge.kill_all()
                raise WorkerGone("TimeoutException", "test case timed out (killed)", True) from None
            if not ({"r", "x", "e"} & reply.keys()) or ("e" in reply and not (
                    type(reply["e"]) is list and len(reply["e"]) == 2)):
                judge.kill_all()
                raise WorkerGone("SandboxCrash", "protocol error: malformed reply from the test process")
            if "r" in reply:
                try:
                    return decode(reply["r"])
                except (ValueError, TypeError) as exc:
                    raise TypeError(f"malformed value from the sandbox: {exc}") from None
            if "x" in reply:
                raise TimeoutException(str(reply["x"]))
            etype, msg = reply["e"]
            raise _remote_exception(str(etype), _short(msg))

        remote.__name__ = name
        return remote


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return


def _judge_exec(source, filename, env, timeout_s, judge):
    """Run trusted test `source` with the case deadline. None on success, else (etype, msg, timed_out)."""
    judge.deadline = time.monotonic() + timeout_s + REPLY_GRACE_S
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s + 2 * REPLY_GRACE_S)
        try:
            exec(compile(source, filename, "exec"), env)  # noqa: S102 - trusted test code
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except WorkerGone:
        raise
    except TimeoutException:
        return "TimeoutException", f"timed out after {timeout_s:g} s", True
    except BaseException as exc:  # noqa: BLE001
        etype, msg = _describe(exc)
        return etype, msg, False
    return None


def main():
    result_fd = int(sys.argv[1])
    libc = _libc()
    in_pidns = os.getpid() == 1
    if libc is not None:
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace, no /proc/1/mem, /proc/1/fd from inside
        if not in_pidns:
            parent = os.getppid()
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)
    out = _Channel(-1, result_fd)
    part_a = _read_part(0)
    if part_a["drop_to"] is not None and in_pidns:
        # The uid of this sandbox alone; /tmp and /dev/shm are private tmpfs mounts.
        for path in ("/tmp", "/dev/shm"):
            try:
                os.chown(path, *part_a["drop_to"])
            except OSError:
                pass
    info = {"pid_ns": in_pidns, "new_session_keyring": _join_new_session_keyring(libc)}
    calls_r, calls_w = os.pipe()  # judge -> worker
    replies_r, replies_w = os.pipe()  # worker -> judge
    pid = os.fork()
    if pid == 0:
        try:
            os.close(calls_w)
            os.close(replies_r)
            worker(part_a, _Channel(calls_r, replies_w), info, libc, in_pidns)
        finally:
            os._exit(4)
    os.close(calls_r)
    os.close(replies_w)
    del part_a["code"]
    part_b = _read_part(0)
    os.close(0)
    sys.stdout, sys.stderr = _CappedSink(), _CappedSink()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    judge = Judge(pid, _Channel(replies_r, calls_w), part_a["limits"], in_pidns, libc)
    timeout_s = part_b["timeout_s"]
    try:
        run(judge, out, part_b, timeout_s)
    except WorkerGone:
        pass
    judge.kill_all()
    os._exit(0)


def add_proxies(judge, env, entry, loaded):
    """Proxies for the model's functions the tests may call. With an entry point (the usual case) that one name
    only: a model-defined ``abs``, ``len``, ``sorted`` or a prompt helper (``encode_shift``) never replaces the
    trusted one the test means. Without one (``run_cases`` given no entry point), every function the model
    defined whose name is neither a builtin nor already bound by trusted code (``math``, the prompt's helpers)."""
    if entry:
        env[entry] = judge.proxy(entry)
        return
    for name in loaded:
        if (isinstance(name, str) and name.isidentifier() and not name.startswith("__")
                and name not in PRISTINE_BUILTINS and name not in env):
            env[name] = judge.proxy(name)


def run(judge, out, part, timeout_s):
    judge.deadline = time.monotonic() + 30.0
    try:
        first = judge.wait_reply("sandbox setup")
        if "setup" not in first:
            raise WorkerGone("SandboxCrash", "protocol error")
    except WorkerGone as gone:
        out.send({"t": "fatal", "etype": gone.etype, "msg": gone.msg})
        raise
    info = first["setup"]
    info["pid_ns"] = judge.in_pidns
    info["mount_ns"] = judge.in_pidns and info.get("fs_read_only", False)
    out.send({"t": "setup", "info": info})

    judge.deadline = time.monotonic() + timeout_s + REPLY_GRACE_S
    try:
        loaded = judge.wait_reply("loading the code")
    except WorkerGone as gone:
        out.send({"t": "code_error", "etype": gone.etype, "msg": gone.msg, "timeout": gone.timed_out})
        return
    if "load_error" in loaded:
        etype, msg, timed_out = loaded["load_error"]
        out.send({"t": "code_error", "etype": etype, "msg": msg, "timeout": timed_out})
        return
    # The test code's namespace: the original builtins, ``math`` (upstream pre-imports it), the problem prompt's
    # own helpers (trusted: run here, never the model's versions), the proxies, then the test setup.
    env = {"__name__": "__sandbox__", "__builtins__": dict(PRISTINE_BUILTINS)}
    exec("import math", env)  # noqa: S102 - trusted
    for source, filename in ((part.get("helpers", ""), "<problem prompt>"), (part["setup"], "<test setup>")):
        if filename == "<test setup>":
            add_proxies(judge, env, part.get("entry_point"), loaded.get("loaded", []))
        if not source.strip():
            continue
        try:
            failure = _judge_exec(source, filename, env, timeout_s, judge)
        except WorkerGone as gone:
            failure = (gone.etype, gone.msg, gone.timed_out)
        if failure is not None:
            etype, msg, timed_out = failure
            out.send({"t": "code_error", "etype": etype, "msg": msg, "timeout": timed_out})
            return
    out.send({"t": "ready"})
    timeouts_left = part["timeouts_left"]
    for index, src in part["cases"]:
        if timeouts_left <= 0:
            break
        env["__sandbox_repr__"] = _safe_repr
        start = time.perf_counter()
        gone = None
        try:
            failure = _judge_exec(_case_source(src), f"<test {index}>", env, timeout_s, judge)
        except WorkerGone as exc:
            gone = exc
            failure = (exc.etype, exc.msg, exc.timed_out)
        elapsed = time.perf_counter() - start
        record = {"t": "result", "i": index, "ok": failure is None, "dt": elapsed}
        if failure is not None:
            record.update(etype=failure[0], msg=failure[1], timeout=failure[2])
            timeouts_left -= failure[2]
        out.send(record, batch=gone is None)
        if gone is not None:
            out.send({"t": "restart"})
            return
        if judge.in_pidns:  # leftovers of the case (the worker kills its own; this is the guarantee)
            for pid in judge._sandbox_pids():
                if pid != judge.worker_pid:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            _reap()
    out.send({"t": "done"})


if __name__ == "__main__":
    main()
