"""One run per folder, atomic snapshots, leftovers of a killed run (issue 31 item 4).

A second live run on a round-file or snapshot folder is refused, naming the first; a killed run holds nothing; a
snapshot is swapped into place whole; a rerun in a folder that another run left full of round files, snapshots and
half-written temporaries ends exactly as a clean run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from iterative_helpers import iter_args, make_trainer

from comlrl_lightning import files
from comlrl_lightning.files import FolderInUseError, RunLock, recover_dirs, replace_dir

ROOT = Path(__file__).resolve().parents[2]
HOLD = ("import sys, time; from comlrl_lightning.files import RunLock; "
        "lock = RunLock(sys.argv[1], 'test', 'x'); lock.acquire(); print('locked', flush=True); time.sleep(600)")


def _folder(path: Path, text: str) -> Path:
    (path / "agent_0").mkdir(parents=True)
    (path / "agent_0" / "weights.txt").write_text(text)
    return path


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "fallback"])
def test_replace_dir_swaps_the_whole_folder_and_leaves_nothing_behind(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    target = _folder(tmp_path / "iteration_0001", "old")
    replace_dir(_folder(tmp_path / ".iteration_0001.new.x", "new"), target)
    assert (target / "agent_0" / "weights.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iteration_0001"]
    replace_dir(_folder(tmp_path / ".initial.new.y", "first"), tmp_path / "initial")  # no target yet: a rename
    assert (tmp_path / "initial" / "agent_0" / "weights.txt").read_text() == "first"


def test_recover_dirs_puts_back_a_snapshot_that_a_crash_left_renamed_aside(tmp_path):
    _folder(tmp_path / ".iteration_0002.old.123", "kept")  # crash between the fallback's two renames
    _folder(tmp_path / "initial", "live")
    _folder(tmp_path / ".initial.old.456", "stale")  # crash after the second rename: the new one is in place
    assert recover_dirs(tmp_path) == ["iteration_0002"]
    assert (tmp_path / "iteration_0002" / "agent_0" / "weights.txt").read_text() == "kept"
    assert (tmp_path / "initial" / "agent_0" / "weights.txt").read_text() == "live"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["initial", "iteration_0002"]


@pytest.fixture
def holder(tmp_path):
    """A live process holding the lock of tmp_path/<name>; killed with SIGKILL at the end."""
    procs = []

    def hold(folder: Path) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert p.stdout.readline().strip() == "locked"
        procs.append(p)
        return p

    yield hold
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_a_live_holder_is_named_and_a_killed_one_holds_nothing(tmp_path, holder):
    p = holder(tmp_path / "runs")
    with pytest.raises(FolderInUseError, match=rf"in use by another run .*\"pid\": {p.pid}.*default_root_dir"):
        RunLock(tmp_path / "runs", "test", "x").acquire()
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    lock = RunLock(tmp_path / "runs", "test", "x")
    lock.acquire()  # the kernel released the killed process's lock
    lock.release()


@pytest.mark.parametrize("folder,option", [("preference_replay", "preference_replay_dir"),
                                           ("policy_checkpoints", "policy_checkpoint_dir")])
def test_a_second_run_on_the_same_root_is_refused_naming_the_first(tiny_model_dir, tmp_path, holder, folder, option):
    first = holder(tmp_path / folder)
    second = make_trainer(tiny_model_dir, tmp_path, args=iter_args(comparator_policy="history"), num_items=2)
    with pytest.raises(FolderInUseError, match=rf"{folder} is in use by another run .*{first.pid}.*{option}"):
        second.train()


def _args(seed: int):
    return iter_args(num_iterations=2, comparator_policy="history", comparator_history_k=1,
                     preference_replay_mode="lambda_decay", preference_replay_lambda=0.8,
                     preference_replay_sample_size=4, seed=seed)


def test_a_rerun_among_a_killed_runs_leftovers_ends_as_a_clean_run(tiny_model_dir, tmp_path):
    clean = make_trainer(tiny_model_dir, tmp_path / "clean", args=_args(0), num_items=3)
    clean.train()
    dirty = tmp_path / "dirty"
    make_trainer(tiny_model_dir, dirty, args=_args(7), num_items=3).train()  # other rounds, other snapshots
    (dirty / "preference_replay" / ".iteration_0002.json.k1.tmp").write_text('{"half": ')  # died mid-write
    _folder(dirty / "policy_checkpoints" / ".iteration_0001.new.k2", "half")
    _folder(dirty / "policy_checkpoints" / ".initial.old.99", "stale")
    rerun = make_trainer(tiny_model_dir, dirty, args=_args(0), num_items=3)
    rerun.train()
    for (name, a), b in zip(clean.module.named_parameters(), rerun.module.parameters()):
        assert torch.equal(a, b), name
    clean_rounds = sorted((tmp_path / "clean" / "preference_replay").glob("iteration_*.json"))
    for path in clean_rounds:
        assert (dirty / "preference_replay" / path.name).read_text() == path.read_text()
    snapshots = dirty / "policy_checkpoints"
    assert not list(snapshots.glob(".*.new.*")) and not list(snapshots.glob(".*.old.*"))
