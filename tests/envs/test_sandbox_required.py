"""Without bubblewrap a code-environment run fails at construction, naming the install command (not at its first
rollout); ``COMLRL_LIGHTNING_NO_BWRAP=1`` hides bwrap from the library, as on a machine without it (CI uses it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from comlrl_lightning.envs.code import make_code_reward_func, make_code_transition, require_sandbox
from comlrl_lightning.envs.code.sandbox import SandboxError, bwrap_path, isolation_info

ROOT = Path(__file__).resolve().parents[2]
INSTALL = "apt-get install bubblewrap"


@pytest.fixture
def no_bwrap(monkeypatch):
    monkeypatch.setenv("COMLRL_LIGHTNING_NO_BWRAP", "1")
    isolation_info.cache_clear()
    yield
    isolation_info.cache_clear()


def test_the_variable_hides_bwrap(no_bwrap, monkeypatch):
    assert bwrap_path() is None
    monkeypatch.setenv("COMLRL_LIGHTNING_NO_BWRAP", "0")  # "0" hides nothing
    monkeypatch.setenv("PATH", str(Path(__file__).parent))
    assert bwrap_path() == shutil.which("bwrap", path="/usr/bin:/bin")


@pytest.mark.parametrize("mode", ["plain", "level_feedback", "level_passed", "passed"])
def test_code_transition_fails_at_construction(no_bwrap, mode):
    with pytest.raises(SandboxError, match=INSTALL) as exc:
        make_code_transition(mode)
    assert f"the code environment ({mode!r} mode) runs model code in a sandbox" in str(exc.value)


def test_code_reward_fails_at_construction(no_bwrap):
    with pytest.raises(SandboxError, match=f"the code reward runs model code in a sandbox.*{INSTALL}"):
        make_code_reward_func(timeout_s=2.0)


def test_unsafe_subprocess_needs_no_bwrap(no_bwrap):
    require_sandbox("unsafe-subprocess")
    make_code_reward_func(isolation="unsafe-subprocess")
    make_code_transition("level_feedback", isolation="unsafe-subprocess")


def test_a_code_config_fails_before_any_rollout(no_bwrap, tmp_path, monkeypatch, capsys):
    from comlrl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(ROOT / "configs/magrpo/code_level_feedback_tiny.yaml"),
              "--trainer.enable_progress_bar=false"])
    assert exc.value.code == 2
    first = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("error: "))
    assert first.startswith("error: the code environment ('level_feedback' mode)") and INSTALL in first
    assert not list(tmp_path.rglob("metrics.csv"))  # no run was started
