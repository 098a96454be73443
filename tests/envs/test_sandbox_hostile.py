"""The hostile-program catalogue (tests/envs/sandbox_hostile_cases.py), run by the caller of pytest (root on
CI) and, in a subprocess, by an unprivileged user (``nobody``): every case must be contained.

A case's test passes only if its attack worked; contained = the test failed and the host-side checks
held (files unchanged, listeners never reached, no process left, the sentinel alive, ...).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import sandbox_hostile_cases as hostile  # noqa: E402

from comlrl_lightning.envs.code.sandbox import SandboxError, isolation_info  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534


def _bwrap_problem() -> str | None:
    if sys.platform != "linux":
        return "the sandbox needs Linux"
    try:
        isolation_info()
    except SandboxError as exc:
        return f"bubblewrap sandbox unavailable: {exc}"
    return None


_SKIP = _bwrap_problem()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")
CASES = sorted(hostile.CASES)


@pytest.mark.parametrize("name", CASES)
def test_contained_for_the_caller(name, tmp_path):
    result = hostile.run_case(name, tmp_path, str(REPO))
    assert result["contained"], result["detail"]


def _as_nobody(argv: list[str], cwd: str, timeout: float) -> subprocess.CompletedProcess:
    setpriv = shutil.which("setpriv")
    cmd = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    env = {"PATH": "/usr/bin:/bin", "HOME": cwd, "LANG": "C.UTF-8"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def unprivileged_results():
    """Run the whole catalogue once as `nobody`, from a copy of the sandbox files it can read."""
    if os.geteuid() != 0:
        pytest.skip("switching to an unprivileged user needs root (the caller run above is already non-root)")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    top = Path(tempfile.mkdtemp(prefix="comlrl-hostile-"))
    try:
        os.chmod(top, 0o755)
        code_dir = top / "repo" / "comlrl_lightning" / "envs" / "code"
        code_dir.mkdir(parents=True)
        src = REPO / "comlrl_lightning" / "envs" / "code"
        for name in ("sandbox.py", "bwrap.py", "cases.py", "_sandbox_child.py", "rewards.py", "analysis.py",
                     "transitions.py", "prompts.py"):
            shutil.copy(src / name, code_dir / name)
        shutil.copytree(src / "data", code_dir / "data")
        shutil.copy(Path(hostile.__file__), top / "sandbox_hostile_cases.py")
        workspace = top / "ws"
        workspace.mkdir()
        os.chown(workspace, NOBODY, NOBODY)
        for path in top.rglob("*"):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        python = None
        for candidate in ("/usr/bin/python3", shutil.which("python3"), sys.executable):
            if candidate and _as_nobody([candidate, "-c", "import json"], str(workspace), 30).returncode == 0:
                python = candidate
                break
        if python is None:
            pytest.skip("no Python interpreter that the user nobody may run")
        probe = _as_nobody(
            [python, "-c", "import shutil, subprocess, sys; sys.exit(subprocess.run(["
             "shutil.which('bwrap'), '--unshare-user', '--ro-bind', '/', '/', 'true']).returncode)"],
            str(workspace), 30,
        )
        if probe.returncode != 0:
            pytest.skip(f"bwrap cannot create a user namespace for an unprivileged user here: {probe.stderr}")
        run = _as_nobody(
            [python, str(top / "sandbox_hostile_cases.py"), str(top / "repo"), str(workspace)],
            str(workspace), 240,
        )
        results = {}
        for line in run.stdout.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                results[record["case"]] = record
        if not results:
            pytest.fail(f"the unprivileged run reported nothing: rc={run.returncode} {run.stderr[-2000:]}")
        yield results
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("name", CASES)
def test_contained_for_an_unprivileged_user(name, unprivileged_results):
    result = unprivileged_results.get(name)
    assert result is not None, f"case {name} did not report"
    assert result["uid"] == NOBODY
    assert result["contained"], result["detail"]


def test_isolation_report_matches_what_is_in_force():
    info = isolation_info()
    assert info["isolation"] == "bwrap"
    for key in ("mount_ns", "pid_ns", "net_ns", "fs_read_only", "home_hidden", "per_sandbox_uid",
                "nproc_enforced", "privileges_dropped", "seccomp", "sockets_unix_only", "keyring_blocked",
                "memfd_blocked", "new_session_keyring"):
        assert info[key] is True, (key, info)
    assert info["user_ns"] == (os.geteuid() != 0)  # root: a per-sandbox uid instead of a user namespace
