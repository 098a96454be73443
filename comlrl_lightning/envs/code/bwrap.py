"""The bubblewrap side of the sandbox (design: ``docs/sandbox.md``): what of the host a sandbox sees and the
``bwrap`` command line that builds it, plus the seccomp filter every process in it runs under.

Stateless and stdlib only: :mod:`.sandbox` calls :func:`bwrap_command` and :func:`seccomp_program` for each
sandbox it starts and keeps the protocol with the judge (the job, the records, the deadlines, the restarts) in one
place. :class:`SandboxError` lives here, the lowest module of the sandbox, because the mount checks raise it;
``sandbox`` imports it from here, and ``from comlrl_lightning.envs.code.sandbox import SandboxError`` works as before.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parents[2]  # comlrl_lightning/: hidden inside the sandbox
#: Where the bootstrap ``_sandbox_child.py`` is mounted inside the sandbox (read-only).
INSIDE_CHILD = "/run/comlrl-sandbox/child.py"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/localtime", "/etc/ld.so.cache",
              "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives")
# A Python prefix that holds any of these would hand the caller's secrets to the model: refused.
_SECRETS = (".ssh", ".netrc", ".git-credentials", ".aws", ".gnupg", ".docker/config.json", ".kube", ".pypirc",
            ".config/gcloud", ".config/gh", ".cache/huggingface/token", ".huggingface/token", ".bash_history")


class SandboxError(RuntimeError):
    """The sandbox itself could not run (not a failure of the code under test)."""


def bwrap_path() -> str | None:
    """The ``bwrap`` program, or None when bubblewrap is not installed (or hidden by ``COMLRL_LIGHTNING_NO_BWRAP=1``,
    which lets a machine that has it check how the library behaves without it: CI does)."""
    if os.environ.get("COMLRL_LIGHTNING_NO_BWRAP", "") not in ("", "0"):
        return None
    return shutil.which("bwrap", path=os.environ.get("PATH", "") + ":/usr/bin:/bin")


# --------------------------------------------------------------------------------------------
# The seccomp filter (classic BPF, handed to bwrap on a descriptor; no libseccomp needed)

# Per architecture: the AUDIT_ARCH value of seccomp_data.arch and the syscall numbers the filter looks at.
_SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, {"socket": 41, "socketpair": 53, "add_key": 248, "request_key": 249, "keyctl": 250,
                            "memfd_create": 319, "io_uring_setup": 425, "io_uring_enter": 426,
                            "io_uring_register": 427, "memfd_secret": 447}),
    "aarch64": (0xC00000B7, {"socket": 198, "socketpair": 199, "add_key": 217, "request_key": 218, "keyctl": 219,
                             "memfd_create": 279, "io_uring_setup": 425, "io_uring_enter": 426,
                             "io_uring_register": 427, "memfd_secret": 447}),
}
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_EPERM, _ENOSYS, _EAFNOSUPPORT, _AF_UNIX = 1, 38, 97, 1


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The filter every process of the sandbox runs under, as ``struct sock_filter`` records; None on an
    architecture it does not know (the sandbox then runs without it and ``isolation_info()`` says so).

    * ``socket``/``socketpair``: only ``AF_UNIX``; any other family fails with ``EAFNOSUPPORT`` (the network
      namespace already has no route out; this also closes ``AF_VSOCK`` to the host, which namespaces do not).
    * ``keyctl``: only joining a new anonymous session keyring (what the judge does at start); ``add_key``,
      ``request_key`` and every other ``keyctl`` fail with ``EPERM``: no key of the caller is reachable.
    * ``memfd_create``/``memfd_secret``: ``EPERM``. Their memory belongs to no process and no mount, so neither
      the memory watchdog nor a tmpfs size could count it; ``/dev/shm`` (counted) serves shared memory.
    * ``io_uring_*``: ``EPERM`` (its operations create sockets and files without passing through this filter).
    * a syscall of another ABI (32-bit ``int 0x80``, x32) kills the process: the numbers above would not apply.
    """
    arch_info = _SECCOMP_ARCHES.get(machine or os.uname().machine)
    if arch_info is None:
        return None
    arch, nr = arch_info
    code: list = []  # (opcode, jump-if-true label, jump-if-false label, k); labels resolved below
    labels: dict[str, int] = {}

    def load(offset: int) -> None:
        code.append((0x20, None, None, offset))  # BPF_LD | BPF_W | BPF_ABS

    def jeq(value: int, true: str | None, false: str | None = None) -> None:
        code.append((0x15, true, false, value))  # BPF_JMP | BPF_JEQ | BPF_K

    def ret(value: int, label: str | None = None) -> None:
        if label:
            labels[label] = len(code)
        code.append((0x06, None, None, value))  # BPF_RET | BPF_K

    load(4)  # seccomp_data.arch
    jeq(arch, None, "kill")
    load(0)  # seccomp_data.nr
    if arch == _SECCOMP_ARCHES["x86_64"][0]:
        code.append((0x35, "enosys", None, 0x40000000))  # BPF_JGE: the x32 ABI
    jeq(nr["socket"], "family")
    jeq(nr["socketpair"], "family")
    jeq(nr["keyctl"], "keyctl")
    for name in ("add_key", "request_key", "memfd_create", "memfd_secret", "io_uring_setup", "io_uring_enter",
                 "io_uring_register"):
        jeq(nr[name], "eperm")
    ret(_RET_ALLOW)
    labels["family"] = len(code)
    load(16)  # args[0], low half (an int)
    jeq(_AF_UNIX, "allow", "eafnosupport")
    labels["keyctl"] = len(code)
    load(16)
    jeq(1, None, "eperm")  # KEYCTL_JOIN_SESSION_KEYRING ...
    load(24)
    jeq(0, None, "eperm")  # ... with a NULL name: a new anonymous keyring, never an existing one
    load(28)
    jeq(0, "allow", "eperm")
    ret(_RET_ERRNO | _EAFNOSUPPORT, "eafnosupport")
    ret(_RET_ERRNO | _EPERM, "eperm")
    ret(_RET_ERRNO | _ENOSYS, "enosys")
    ret(_RET_KILL_PROCESS, "kill")
    ret(_RET_ALLOW, "allow")
    out = b""
    for i, (op, true, false, k) in enumerate(code):
        jt = labels[true] - i - 1 if true else 0
        jf = labels[false] - i - 1 if false else 0
        out += struct.pack("=HBBI", op, jt, jf, k)
    return out


# --------------------------------------------------------------------------------------------
# Mounts and the command line


@lru_cache(maxsize=8)
def _prefixes(python: str) -> tuple[str, ...]:
    """The installation prefixes (``sys.base_prefix``, ``sys.base_exec_prefix``) of interpreter `python`, real
    paths: asked from the interpreter itself unless it is this one."""
    if python == os.path.realpath(sys.executable):
        found = [sys.base_prefix, sys.base_exec_prefix]
    else:
        try:
            out = subprocess.run(
                [python, "-I", "-S", "-c", "import sys; print(sys.base_prefix); print(sys.base_exec_prefix)"],
                capture_output=True, text=True, timeout=30, check=True, env={"PATH": "/usr/bin:/bin"},
            ).stdout.splitlines()
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxError(f"sandbox option python={python!r}: cannot run this interpreter ({exc})") from None
        found = out[:2]
    return tuple(dict.fromkeys(os.path.realpath(p) for p in found if p))


def _homes() -> set[str]:
    homes = {"/root", "/home", os.path.expanduser("~"), os.environ.get("HOME", "")}
    return {os.path.realpath(h) for h in homes if h and h != "/"}


def _python_dirs(python: str) -> list[str]:
    """What of the interpreter is mounted into the sandbox, read-only: its own installation prefix(es) and,
    when the binary lies outside them, the binary alone. Never a home directory or a folder holding one: a
    prefix that is a home or contains one, or that holds a secret of the caller (``~/.ssh``, ``.netrc``, a
    Hugging Face token, ...), raises :class:`SandboxError` naming it."""
    binary = os.path.realpath(python)
    mounts = []
    for prefix in _prefixes(binary):
        if prefix == "/usr" or prefix.startswith("/usr/") or prefix == "/":
            continue  # the system directories are mounted anyway
        home = next((h for h in sorted(_homes()) if h == prefix or h.startswith(prefix.rstrip("/") + "/")), None)
        secret = next((n for n in _SECRETS if os.path.lexists(os.path.join(prefix, n))), None)
        if home is not None or secret is not None:
            what = f"the home directory {home}" if home is not None else os.path.join(prefix, secret)
            raise SandboxError(
                f"refusing to mount the Python installation {prefix} (of the interpreter {python}) into the "
                f"sandbox: it holds {what}, which the model's code could then read. Use a Python installed "
                "outside any home directory, or in a folder of its own such as ~/.pyenv/versions/3.11.7, or pass "
                "the sandbox option python=<interpreter> of such an installation."
            )
        if os.access(prefix, os.R_OK | os.X_OK):
            mounts.append(prefix)
    inside = [*_SYSTEM_DIRS, *mounts]
    if not any(binary == d or binary.startswith(d.rstrip("/") + "/") for d in inside):
        mounts.append(binary)  # a file mount: its folder (perhaps a home) stays out
    return sorted(mounts)


def bwrap_command(python: str, tmp_bytes: int, as_root: bool, child: Path, seccomp_fd: int | None = None) -> list[str]:
    """The ``bwrap`` command line (up to its ``--``) of one sandbox: namespaces, capabilities, mounts, the seccomp
    filter read from descriptor `seccomp_fd`, and the bootstrap `child` mounted at :data:`INSIDE_CHILD`."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise SandboxError(
            "no safe sandbox is available: the bubblewrap program `bwrap` is not installed (Debian/Ubuntu: "
            "`apt-get install bubblewrap`). To run model code without isolation anyway, pass the sandbox "
            "option isolation='unsafe-subprocess' (unsafe: the code can read your files and reach the network)."
        )
    cmd = [bwrap, "--die-with-parent", "--new-session", "--as-pid-1",
           "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if as_root:
        # No user namespace for root: inside one the code would keep uid 0's file access. The judge
        # keeps only what it needs to drop the worker to the per-sandbox uid and to kill it.
        cmd += ["--cap-drop", "ALL"]
        for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN"):
            cmd += ["--cap-add", cap]
    else:
        cmd += ["--unshare-user", "--disable-userns"]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            cmd += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            cmd += ["--ro-bind", path, path]
    for path in _ETC_FILES:
        cmd += ["--ro-bind-try", path, path]
    python_dirs = _python_dirs(python)
    for path in python_dirs:
        cmd += ["--ro-bind", path, path]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    package = str(_PACKAGE_DIR)
    if any(package == d or package.startswith(d.rstrip("/") + "/") for d in [*_SYSTEM_DIRS, *python_dirs]):
        cmd += ["--tmpfs", package]  # an installed copy: its hidden tests stay out of reach
    size = str(tmp_bytes)
    cmd += ["--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", size, "--tmpfs", "/tmp",
            "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm",
            "--dir", "/var", "--symlink", "/tmp", "/var/tmp",
            "--ro-bind", str(child), INSIDE_CHILD,
            # bwrap's own root and /dev are tmpfs mounts without a size cap, writable from inside a user
            # namespace: read-only (not recursive: /tmp and /dev/shm stay writable; device nodes still work).
            "--remount-ro", "/", "--remount-ro", "/dev", "--chdir", "/tmp", "--"]
    return cmd
