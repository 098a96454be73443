"""The sandbox: per-case results, timeouts, and containment of hostile programs.

Every hostile program must end as a clear per-test failure while this (pytest) process lives on,
and nothing it started may survive the call. Timeouts are short (0.5-1 s) to keep the file fast.
"""

from __future__ import annotations

import os
import re
import shutil
import socket

import pytest

from comlrl_lightning.envs.code.sandbox import (
    TestResult,
    extract_test_cases,
    isolation_info,
    isolation_level,
    run_cases,
    run_tests,
    run_tests_many,
    unavailable_reason,
)

_SKIP = unavailable_reason()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")

ONE = "def check(candidate):\n    assert candidate() == 1\n"
TWO = "def check(candidate):\n    assert candidate() == 1\n    assert candidate() != 2\n"
FAST = {"timeout_s": 1.0, "memory_mb": 256, "max_file_mb": 4, "max_processes": 16}

# The opt-in weaker mode is exercised too, where it is only about containment it still offers.
MODES = [pytest.param({}, id="bwrap"), pytest.param({"isolation": "unsafe-subprocess"}, id="unsafe-subprocess")]


def sandbox_processes() -> list[int]:
    """Pids of processes still running this checkout's sandbox bootstrap (matched by its full path, so that another
    test run on the same machine, from another checkout, is not counted)."""
    from comlrl_lightning.envs.code import sandbox

    marker = str(sandbox._CHILD).encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if marker in fh.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def only(results: list[TestResult]) -> TestResult:
    assert len(results) == 1
    return results[0]


# ---------------------------------------------------------------------------------------------
# Extraction and plain results


def test_extract_test_cases_splits_renames_and_dedupes():
    test = (
        "import math\n\nMETADATA = {}\n\n\ndef check(candidate):\n"
        "    assert candidate(1) == 2\n"
        "    assert candidate(1) == 2\n"
        "    assert candidate(\n        [1, 2]\n    ) == 3\n"
        "    x = 5\n"
        "    assert x == 5\n"
        "    assert abs(candidate(0.5) - 1.0) < 1e-6\n"
    )
    cases = extract_test_cases(test, "f")
    assert cases == [
        "assert f(1) == 2",
        "assert f(\n        [1, 2]\n    ) == 3",
        "assert abs(f(0.5) - 1.0) < 1e-6",
    ]
    # asserts only inside a loop: the whole check is kept as one case
    loop = "def check(candidate):\n    for i in range(3):\n        assert candidate(i) == i\n"
    assert extract_test_cases(loop, "g") == ["check(g)"]
    # unparseable test code: the line rule of the spec
    broken = "def check(candidate):\n    assert candidate(1) == 1\n    assert candidate(2 == 2\n"
    assert extract_test_cases(broken, "h") == ["assert h(1) == 1", "assert h(2 == 2"]
    assert extract_test_cases("", "f") == [] and extract_test_cases("x = 1", "f") == []


def test_pass_fail_messages_and_order():
    code = "def add(a, b):\n    return a + b\n"
    test = (
        "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 5\n"
        "    assert candidate('a', 1) == 'a1'\n    assert candidate(1, 1) > 5, 'too small'\n"
    )
    r = run_tests(code, test, "add", timeout_s=2.0)
    assert [x.index for x in r] == [0, 1, 2, 3]
    assert [x.passed for x in r] == [True, False, False, False]
    assert (r[1].error_type, r[1].error_message) == ("AssertionError", "expected 5, got 4")
    assert r[2].error_type == "TypeError"
    assert (r[3].error_type, r[3].error_message) == ("AssertionError", "too small")
    assert r[1].case == "assert add(2, 2) == 5" and not any(x.timed_out or x.skipped for x in r)


def test_test_setup_and_math_are_available():
    code = "def area(r):\n    return math.pi * r * r\n"
    test = "TOL = 1e-9\n\n\ndef check(candidate):\n    assert abs(candidate(1) - math.pi) < TOL\n"
    assert only(run_tests(code, test, "area", timeout_s=2.0)).passed


def test_syntax_error_fails_every_case():
    r = run_tests("def f(:\n    return 1\n", TWO, "f", **FAST)
    assert len(r) == 2 and all(x.error_type == "SyntaxError" and not x.passed for x in r)


def test_code_that_defines_nothing():
    r = run_tests("x = 1\n", TWO, "f", **FAST)
    assert [(x.passed, x.error_type) for x in r] == [(False, "NameError")] * 2


def test_exception_while_loading_code_fails_every_case_with_it():
    r = run_tests("raise ValueError('boom')\ndef f():\n    return 1\n", TWO, "f", **FAST)
    assert [(x.error_type, x.error_message) for x in r] == [("ValueError", "boom")] * 2


def test_empty_test_code_gives_no_results():
    assert run_tests("def f():\n    return 1\n", "", "f") == []


# ---------------------------------------------------------------------------------------------
# Timeouts


def test_infinite_loop_times_out():
    r = only(run_tests("def f():\n    while True:\n        pass\n", ONE, "f", **FAST))
    assert (r.passed, r.timed_out, r.error_type) == (False, True, "TimeoutException")


def test_loop_that_swallows_the_alarm_is_killed_and_remaining_cases_still_run():
    code = (
        "import signal\n"
        "def f(x):\n"
        "    if x == 0:\n"
        "        signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "        while True:\n"
        "            pass\n"
        "    return x\n"
    )
    test = "def check(candidate):\n    assert candidate(0) == 0\n    assert candidate(1) == 1\n"
    r = run_tests(code, test, "f", timeout_s=0.5)
    assert r[0].timed_out and "killed" in r[0].error_message
    assert r[1].passed  # ran in a fresh child


def test_after_max_timeouts_remaining_cases_are_failed_without_running():
    code = "def f(x):\n    if x < 2:\n        while True:\n            pass\n    return x\n"
    test = "def check(candidate):\n" + "".join(f"    assert candidate({i}) == {i}\n" for i in range(5))
    r = run_tests(code, test, "f", timeout_s=0.5, max_timeouts=2)
    assert [x.timed_out for x in r] == [True, True, False, False, False]
    assert [x.skipped for x in r] == [False, False, True, True, True]
    assert not any(x.passed for x in r)  # cases 2-4 would pass but were never run
    assert all(x.error_type == "TimeoutException" for x in r)


def test_default_max_timeouts_is_three():
    code = "def f(x):\n    while True:\n        pass\n"
    test = "def check(candidate):\n" + "".join(f"    assert candidate({i}) == {i}\n" for i in range(4))
    r = run_cases(code, extract_test_cases(test, "f"), timeout_s=0.3)
    assert [x.timed_out for x in r] == [True, True, True, False] and r[3].skipped


# ---------------------------------------------------------------------------------------------
# Hostile programs


def test_memory_hog_is_contained():
    code = "def f():\n    blocks = []\n    while True:\n        blocks.append(bytearray(10**7))\n"
    r = only(run_tests(code, ONE, "f", **{**FAST, "memory_mb": 128}))
    assert not r.passed and r.error_type in {"MemoryError", "SandboxCrash"}


def test_bounded_fork_loop_hits_the_process_limit():
    # Verifies the process limit before any real fork bomb is attempted.
    info = isolation_info()
    if not info["nproc_enforced"]:
        pytest.skip("RLIMIT_NPROC is not enforced for the sandboxed code here")
    code = (
        "import os, time\n"
        "def f():\n"
        "    for i in range(64):\n"
        "        try:\n"
        "            pid = os.fork()\n"
        "        except OSError:\n"
        "            return i\n"
        "        if pid == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "    return 64\n"
    )
    test = "def check(candidate):\n    assert candidate() == -1\n"
    r = only(run_tests(code, test, "f", **{**FAST, "max_processes": 8}))
    forks = int(re.search(r"got (\d+)", r.error_message).group(1))
    assert forks < 8 and not sandbox_processes()


@pytest.mark.parametrize("mode", MODES)
def test_fork_bomb_is_contained(mode):
    info = isolation_info()
    if not info["nproc_enforced"]:
        pytest.skip("RLIMIT_NPROC is not enforced for the sandboxed code here: a fork bomb is unsafe")
    bomb = "import os\ndef f():\n    while True:\n        os.fork()\n"
    r = run_tests(bomb, TWO, "f", **{**FAST, **mode})
    assert len(r) == 2 and not any(x.passed for x in r)
    stubborn = (
        "import os\ndef f():\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n"
    )
    r = only(run_tests(stubborn, ONE, "f", **{**FAST, **mode}))
    assert not r.passed and r.timed_out
    assert not sandbox_processes()


@pytest.mark.parametrize("mode", MODES)
def test_daemonized_child_does_not_survive(mode):
    code = (
        "import os, time\n"
        "def f():\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "        os._exit(0)\n"
        "    return 1\n"
    )
    r = only(run_tests(code, ONE, "f", **{**FAST, **mode}))
    assert r.passed
    assert not sandbox_processes()


def test_large_file_write_fails_cleanly():
    code = (
        "def f():\n"
        "    with open('big.bin', 'wb') as fh:\n"
        "        for _ in range(16):\n"
        "            fh.write(b'x' * 2**20)\n"
        "    return 1\n"
    )
    r = only(run_tests(code, ONE, "f", **{**FAST, "max_file_mb": 2}))
    assert not r.passed and r.error_type == "OSError" and "too large" in r.error_message.lower()


def test_work_dir_is_private_and_removed(tmp_path):
    # bwrap: the work dir is a private tmpfs (/tmp inside); nothing of it ever reaches the host.
    marker = f"note-{os.getpid()}-{tmp_path.name}.txt"
    code = f"import os\ndef f():\n    open({marker!r}, 'w').write('hi')\n    return os.getcwd()\n"
    r = only(run_tests(code, ONE, "f", **FAST))
    workdir = re.search(r"got '([^']+)'", r.error_message).group(1)
    assert workdir != os.getcwd() and not os.path.exists(os.path.join(workdir, marker))
    r = only(run_tests(code, ONE, "f", **FAST, isolation="unsafe-subprocess"))
    workdir = re.search(r"got '([^']+)'", r.error_message).group(1)
    assert "comlrl-sandbox-" in workdir and not os.path.exists(workdir)


@pytest.mark.parametrize("mode", MODES)
def test_secrets_in_the_parent_environment_are_invisible(mode, monkeypatch):
    monkeypatch.setenv("COMLRL_FAKE_API_KEY", "sk-fake-7f3a9c1e")
    code = (
        "import os\n"
        "def f():\n"
        "    leaks = [k for k, v in os.environ.items() if 'sk-fake' in v]\n"
        "    for pid in os.listdir('/proc'):\n"
        "        if pid.isdigit():\n"
        "            try:\n"
        "                with open(f'/proc/{pid}/environ', 'rb') as fh:\n"
        "                    if b'sk-fake' in fh.read():\n"
        "                        leaks.append(pid)\n"
        "            except OSError:\n"
        "                pass\n"
        "    return leaks\n"
    )
    test = "def check(candidate):\n    assert candidate() == []\n"
    if os.geteuid() != 0 and mode:
        pytest.skip("unsafe-subprocess without a uid switch: /proc/<parent>/environ stays readable")
    r = only(run_tests(code, test, "f", **{**FAST, **mode}))
    assert r.passed, r.error_message
    env_test = "def check(candidate):\n    assert candidate() == 1\n"
    allowed = {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "PWD", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE"}
    keys = f"import os\ndef f():\n    return int(set(os.environ) <= {allowed!r})\n"
    assert only(run_tests(keys, env_test, "f", **FAST)).passed


@pytest.mark.parametrize("options", MODES)
def test_network_is_unreachable(options):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.3)
    port = listener.getsockname()[1]
    code = (
        "import socket\n"
        "def f():\n"
        f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "    s.sendall(b'leak')\n"
        "    return 1\n"
    )
    try:
        r = only(run_tests(code, ONE, "f", **{**FAST, **options}))
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    assert not r.passed and r.error_type in {
        "OSError",
        "PermissionError",
        "ConnectionRefusedError",
        "TimeoutError",
    }


def test_killing_the_parent_does_not_kill_the_caller():
    code = "import os, signal\ndef f():\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 1\n"
    r = run_tests(code, TWO, "f", **FAST)
    assert len(r) == 2  # we are still here, with one result per case
    assert all(
        x.passed or x.error_type in {"PermissionError", "SandboxCrash", "ProcessLookupError"} for x in r
    )


def test_sys_exit_and_os_exit_inside_a_case():
    code = (
        "import os, sys\n"
        "def f(x):\n"
        "    if x == 1:\n"
        "        sys.exit(3)\n"
        "    if x == 2:\n"
        "        os._exit(0)\n"
        "    return x\n"
    )
    test = "def check(candidate):\n" + "".join(f"    assert candidate({i}) == {i}\n" for i in range(4))
    r = run_tests(code, test, "f", **FAST)
    assert [x.passed for x in r] == [True, False, False, True]
    assert r[1].error_type == "SystemExit" and "3" in r[1].error_message
    assert r[2].error_type == "SandboxCrash" and "exited" in r[2].error_message


def test_os_exit_while_loading_fails_every_case():
    r = run_tests("import os\nos._exit(1)\n", TWO, "f", **FAST)
    assert [x.error_type for x in r] == ["SandboxCrash"] * 2


def test_stdout_and_stderr_floods_are_capped():
    code = (
        "import os, sys\n"
        "def f():\n"
        "    for _ in range(20000):\n"
        "        print('x' * 1000)\n"
        "        sys.stderr.write('y' * 1000)\n"
        "    os.write(1, b'z' * 5 * 2**20)\n"
        "    os.write(2, b'z' * 5 * 2**20)\n"
        "    return 1\n"
    )
    assert only(run_tests(code, ONE, "f", **FAST)).passed


def test_deep_recursion():
    code = "def f(n=0):\n    return f(n + 1)\n"
    r = only(run_tests(code, ONE, "f", **FAST))
    assert r.error_type == "RecursionError"
    unlimited = "import sys\nsys.setrecursionlimit(10**8)\ndef f(n=0):\n    return f(n + 1)\n"
    r = only(run_tests(unlimited, ONE, "f", **{**FAST, "memory_mb": 128}))
    assert not r.passed  # memory, stack or time runs out; either way a contained failure


def test_forged_result_lines_are_ignored():
    code = (
        "import os, sys\n"
        "def f():\n"
        "    for fd in (int(sys.argv[1]), 3, 4, 5, 6):\n"
        "        try:\n"
        '            os.write(fd, b\'{"t": "result", "i": 0, "ok": true}\\n{"t": "done"}\\n\')\n'
        "        except OSError:\n"
        "            pass\n"
        '    print(\'{"t": "result", "i": 0, "ok": true}\')\n'
        "    return 2\n"
    )
    r = only(run_tests(code, ONE, "f", **FAST))
    # The fd of the trainer's result pipe is closed before the code runs; a line written on the
    # worker's own reply channel desynchronises it: the case fails either way.
    assert not r.passed and r.error_type in {"SandboxCrash", "AssertionError"}


def test_fork_inside_a_case_does_not_duplicate_results():
    code = "import os\ndef f(x):\n    os.fork()\n    return x\n"
    test = "def check(candidate):\n    assert candidate(1) == 1\n    assert candidate(2) == 2\n"
    r = run_tests(code, test, "f", **FAST)
    assert [x.passed for x in r] == [True, True]


def test_run_tests_many_keeps_order_and_limits_workers():
    jobs = [
        {"code": f"def f():\n    return {i}\n", "test_code": ONE, "entry_point": "f"} for i in range(4)
    ] + [("def g():\n    while True:\n        pass\n", ONE, "g")]
    results = run_tests_many(jobs, max_workers=2, timeout_s=1.0)
    assert [only(r).passed for r in results] == [False, True, False, False, False]
    assert results[4][0].timed_out
    with pytest.raises(ValueError, match="max_workers"):
        run_tests_many(jobs, max_workers=0)


def test_isolation_level_is_reported():
    info = isolation_info()
    assert isolation_level() == info["isolation"] == "bwrap"
    assert info["net_ns"] and info["pid_ns"] and info["mount_ns"] and info["fs_read_only"]
    assert info["home_hidden"] and info["per_sandbox_uid"] and info["nproc_enforced"]
    assert info["privileges_dropped"] and info["uid"] != 0
    unsafe = isolation_info("unsafe-subprocess")
    assert unsafe["isolation"] == "unsafe-subprocess" and not unsafe["net_ns"] and unsafe["socket_block"]


def test_bad_options_are_rejected():
    with pytest.raises(TypeError, match="unknown sandbox option"):
        run_tests("def f():\n    return 1\n", ONE, "f", memory=5)
    for bad in (0, -1.0, float("nan"), float("inf"), "3", True):
        with pytest.raises(ValueError, match="timeout_s=.*positive finite"):
            run_tests("def f():\n    return 1\n", ONE, "f", timeout_s=bad)
    for name, bad in (("memory_mb", 0), ("memory_mb", -5), ("memory_mb", float("inf")),
                      ("max_processes", 0), ("max_processes", 2.5), ("tmp_mb", float("nan")),
                      ("max_tmp_files", 0), ("max_tmp_files", 1.5)):
        with pytest.raises(ValueError, match=f"{name}=.*not allowed"):
            run_tests("def f():\n    return 1\n", ONE, "f", **{name: bad})
    with pytest.raises(ValueError, match="isolation=.*unsafe-subprocess"):
        run_tests("def f():\n    return 1\n", ONE, "f", isolation="none")
    with pytest.raises(ValueError, match="entry_point='1f'.*name of the function"):
        run_cases("def f():\n    return 1\n", ["assert f() == 1"], entry_point="1f")


# ---------------------------------------------------------------------------------------------
# The isolated judge, the seccomp filter, the interpreter's mounts (issue 31; the attacks themselves are in
# tests/envs/sandbox_hostile_cases.py)


def test_tests_see_the_entry_point_only():
    code = "def g():\n    return 2\ndef f():\n    return g()\n"
    cases = ["assert f() == 2", "assert g() == 2"]
    strict = run_cases(code, cases, entry_point="f", **FAST)
    assert [r.passed for r in strict] == [True, False] and strict[1].error_type == "NameError"
    # Without an entry point, the model's functions are visible, but never over a builtin or trusted name.
    loose = run_cases(code + "def len(x):\n    return 7\n", [*cases, "assert len([1]) == 1"], **FAST)
    assert [r.passed for r in loose] == [True, True, True]


def test_prompt_helpers_run_on_the_judge_side():
    from comlrl_lightning.envs.code.cases import prompt_helpers

    prompt = (
        "import math\nfrom typing import List\nK = 3\n\n"
        "@staticmethod\ndef _unused():\n    pass\n\n"
        "def poly(xs: list, x: float):\n    return sum(c * x ** i for i, c in enumerate(xs))\n\n"
        "def find_zero(xs: list):\n    \"\"\"Docstring.\"\"\"\n"
    )
    helpers = prompt_helpers(prompt, "find_zero")
    assert "def poly" in helpers and "find_zero" not in helpers and "@staticmethod" in helpers
    assert "    import math\nexcept ImportError:" in helpers and "K = 3" in helpers
    assert prompt_helpers("Write a function that adds two numbers.", "f") == ""
    code = "def poly(xs, x):\n    return 0\ndef find_zero(xs):\n    return 5.0\n"  # wrong, with a forged poly
    test = "def check(candidate):\n    assert abs(poly([1, 1], candidate([1, 1]))) < 1e-6\n"
    assert not only(run_tests(code, test, "find_zero", prompt=prompt, **FAST)).passed
    right = "def find_zero(xs):\n    return -1.0\n"
    assert only(run_tests(right, test, "find_zero", prompt=prompt, **FAST)).passed


def test_a_remote_stop_iteration_is_no_stop_iteration():
    code = "def f(x):\n    raise StopIteration('done')\n"
    cases = ["assert list(map(f, [1])) == []",
             "try:\n    f(1)\nexcept StopIteration:\n    raise AssertionError('a StopIteration crossed')\n"
             "except Exception as exc:\n    assert type(exc).__name__ == 'StopIteration', exc\n"]
    r = run_cases(code, cases, entry_point="f", **FAST)
    assert [x.passed for x in r] == [False, True] and r[0].error_type == "StopIteration"


def test_seccomp_program_is_well_formed():
    import struct

    from comlrl_lightning.envs.code.bwrap import _SECCOMP_ARCHES, seccomp_program

    assert seccomp_program("sparc") is None
    for machine, (arch, numbers) in _SECCOMP_ARCHES.items():
        program = seccomp_program(machine)
        assert len(program) % 8 == 0 and 8 < len(program) // 8 < 256
        insns = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
        assert insns[0] == (0x20, 0, 0, 4) and insns[1][0] == 0x15 and insns[1][3] == arch  # the arch first
        for i, (op, jt, jf, _k) in enumerate(insns):  # every jump lands inside the program
            assert op == 0x06 or i + 1 + max(jt, jf) < len(insns)
        assert insns[-1] == (0x06, 0, 0, 0x7FFF0000) and insns[-2] == (0x06, 0, 0, 0x80000000)
        compared = {k for op, _jt, _jf, k in insns if op == 0x15}
        assert {numbers[n] for n in ("socket", "socketpair", "keyctl", "memfd_create", "add_key")} <= compared
    assert seccomp_program("x86_64") != seccomp_program("aarch64")


def test_a_python_prefix_with_secrets_is_refused(tmp_path, monkeypatch):
    from comlrl_lightning.envs.code import bwrap

    prefix = tmp_path / "python"
    (prefix / "bin").mkdir(parents=True)
    monkeypatch.setattr(bwrap, "_prefixes", lambda python: (str(prefix),))
    assert bwrap._python_dirs(str(prefix / "bin" / "python3")) == [str(prefix)]
    for secret in (".ssh/id_ed25519", ".netrc", ".cache/huggingface/token"):
        path = prefix / secret
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("secret")
        with pytest.raises(bwrap.SandboxError, match=f"refusing to mount the Python installation {prefix}.*"
                                                       f"{secret.split('/')[0]}"):
            bwrap._python_dirs(str(prefix / "bin" / "python3"))
        top = prefix / secret.split("/")[0]
        shutil.rmtree(top) if top.is_dir() else top.unlink()
    monkeypatch.setenv("HOME", str(prefix / "me"))  # a prefix that holds a home directory
    with pytest.raises(bwrap.SandboxError, match="home directory"):
        bwrap._python_dirs(str(prefix / "bin" / "python3"))
    # A binary outside its prefix (a copy in a home's bin/) is mounted alone, never its folder.
    monkeypatch.setattr(bwrap, "_prefixes", lambda python: ("/usr",))
    assert bwrap._python_dirs(str(tmp_path / "bin" / "python3")) == [str(tmp_path / "bin" / "python3")]


def test_isolation_info_reports_the_new_limits():
    info = isolation_info()
    for key in ("seccomp", "sockets_unix_only", "keyring_blocked", "memfd_blocked", "new_session_keyring"):
        assert info[key] is True, (key, info)
    assert "SysV" in info["memory_budget"] and "/dev/shm" in info["memory_budget"]


def test_tmp_file_and_memory_limits_fail_the_case_only():
    files = "def f():\n    for i in range(1000):\n        open(f'/tmp/{i}', 'w').close()\n    return 1\n"
    r = only(run_tests(files, ONE, "f", **{**FAST, "max_tmp_files": 100}))
    assert not r.passed and r.error_type == "OSError" and "max_tmp_files=100" in r.error_message
    assert only(run_tests(files, ONE, "f", **{**FAST, "max_tmp_files": 2000})).passed
    shm = ("import time\ndef f():\n    with open('/dev/shm/x', 'wb') as fh:\n        for _ in range(60):\n"
           "            fh.write(b'x' * (1 << 20))\n    time.sleep(0.3)\n    return 1\n")
    r = only(run_tests(shm, ONE, "f", **{**FAST, "memory_mb": 64, "max_file_mb": 64}))
    assert not r.passed and r.error_type == "MemoryError" and "/dev/shm" in r.error_message
