"""kill -9 inside a round of MADPOIter, MARLHF and MARLHFIter, then resume from the newest checkpoint in the same
folder (issue 31 item 3): the weights, the counters and every row logged after the checkpoint equal the uninterrupted
run's. The harness is tests/modules/test_mid_epoch_resume_kill.py's (the training process checkpoints after every
batch and sends itself SIGKILL just before an optimizer step); here the step is drawn, seeded per family, among those
whose newest checkpoint lies inside an epoch (a round), so every run crosses the kill mid-round and then the
round/epoch boundary after it.

A kill at the first step of a round leaves as newest a checkpoint taken after the previous round's last batch but
before its end (where the next round is collected): the rounds families refuse it, naming the checkpoint to use
(docs/guide.md §1.1), and a resume from that one equals the uninterrupted run."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from test_mid_epoch_resume import COMMON, FAMILIES, build, loader_state
from test_mid_epoch_resume_kill import checkpoint_step, killed_run

from comlrl_lightning.config.marlhf import MARLHFConfig, MARLHFIterConfig
from comlrl_lightning.trainers.marlhf import MARLHFIterTrainer, MARLHFTrainer

SCRIPT = Path(__file__).resolve().parent / "rounds_kill_script.py"
ROOT = Path(__file__).resolve().parents[2]
RLHF = {"num_generations": 2, "rollout_buffer_size": 2, "preference_num_candidates": 3, "preference_pairs_per_sample": 2,
        "reward_learning_rate": 1e-3, "reward_train_batch_size": 4, "reward_num_train_epochs": 1, "logging_steps": 3}
EXTRA_FAMILIES = {
    "marlhf": lambda: dict(cls=MARLHFTrainer, args=MARLHFConfig(**RLHF, **COMMON), shuffle=True, extra={}),
    "marlhf-iter": lambda: dict(cls=MARLHFIterTrainer, args=MARLHFIterConfig(
        num_iterations=2, **RLHF, **{**COMMON, "num_train_epochs": 1}), shuffle=True, extra={}),
}
ROUNDS = ["madpo-iter", "marlhf", "marlhf-iter"]


@pytest.fixture(autouse=True)
def _families(monkeypatch):
    monkeypatch.setitem(FAMILIES, "marlhf", EXTRA_FAMILIES["marlhf"])
    monkeypatch.setitem(FAMILIES, "marlhf-iter", EXTRA_FAMILIES["marlhf-iter"])


class StepsOfBatches(L.Callback):
    """The uninterrupted run's record: global_step, epoch and whether it was the epoch's last batch, per batch."""

    def __init__(self):
        self.after: list[tuple[int, int, bool]] = []  # (global_step, epoch, last batch of the epoch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after.append((trainer.global_step, trainer.current_epoch, trainer.fit_loop.epoch_loop.batch_progress
                           .is_last_batch))


def _saves(record: StepsOfBatches) -> list[tuple[int, int, bool]]:
    """The batch ends where ``ModelCheckpoint(every_n_train_steps=1)`` writes: those that stepped an optimizer."""
    return [a for i, a in enumerate(record.after) if a[0] > (record.after[i - 1][0] if i else 0)]


def _newest(saves, kill_at: int):
    before = [a for a in saves if a[0] < kill_at]
    return before[-1] if before else None


class CountSteps(L.Callback):
    def __init__(self):
        self.steps = 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.steps += 1


def _resumed(family, model_dir, root):
    """The rerun in the killed run's folder (the script's trainer, no kill); ``trainer.steps_taken`` counts the
    optimizer steps it takes (those after the checkpoint only, or it did not resume)."""
    counter = CountSteps()
    t, log = build(family, model_dir, enable_checkpointing=True, default_root_dir=str(root), callbacks=[
        ModelCheckpoint(dirpath=str(root / "ckpt"), filename="{step}", every_n_train_steps=1, save_top_k=-1), counter])
    t.steps_taken = counter
    return t, log


def _assert_equal_runs(family, where, full, full_log, resumed, log, checkpoint: Path):
    print(where)
    taken = full.trainer.global_step - torch.load(checkpoint, weights_only=False)["global_step"]
    assert resumed.steps_taken.steps == taken > 0, f"{where}: {resumed.steps_taken.steps} steps taken, not {taken}"
    final = resumed.module.state_dict()
    for name, value in full.module.state_dict().items():
        assert torch.equal(final[name], value), f"{where}: {name} differs by {(final[name] - value).abs().max()}"
    assert resumed.trainer.global_step == full.trainer.global_step, where
    assert resumed.module.env_step == full.module.env_step, where
    assert resumed.module.updates_seen == full.module.updates_seen, where
    full_rounds = Path(full.trainer.default_root_dir) / "preference_replay"
    if full_rounds.is_dir():  # the round files (pairs, replay index) too
        ours = Path(resumed.trainer.default_root_dir) / "preference_replay"
        names = sorted(p.name for p in full_rounds.iterdir() if p.is_file())
        assert names and names == sorted(p.name for p in ours.iterdir() if p.is_file()), where
        for name in names:
            assert (ours / name).read_bytes() == (full_rounds / name).read_bytes(), f"{where}: round file {name} differs"
    rows = _after_refit(log.rows, full_log.rows, where)
    tail = full_log.rows[len(full_log.rows) - len(rows):]
    assert rows and rows == tail, f"{where}: resumed rows {rows[:3]} != {tail[:3]}"


REWARD_MODEL_KEYS = ("round/", "reward_model/", "train/reward_model/", "val/reward_model/")


def _after_refit(rows: list, full_rows: list, where: str) -> list:
    """The resumed rows after the reward model's refit at fit start (MARLHF, MARLHFIter: the reward model is not in
    the checkpoint; it is refitted on the pairs the checkpoint holds, and that fit logs its rows again). The refit
    must reproduce the uninterrupted run's fit: its training loss is one the uninterrupted run logged."""
    n = 0
    while n < len(rows) and all(k.startswith(REWARD_MODEL_KEYS) for k in rows[n][1]):
        n += 1
    refit = [r["train/reward_model/loss"] for _, r in rows[:n] if "train/reward_model/loss" in r]
    fitted = {r["train/reward_model/loss"] for _, r in full_rows if "train/reward_model/loss" in r}
    assert all(loss in fitted for loss in refit), f"{where}: refit losses {refit} not among {sorted(fitted)}"
    return rows[n:]


_UNINTERRUPTED: dict[str, tuple] = {}


def _uninterrupted(family: str, model_dir: str, tmp_path_factory) -> tuple:
    """(trainer, logger, the checkpoint writes of StepsOfBatches) of the family's uninterrupted run, once per session."""
    if family not in _UNINTERRUPTED:
        record = StepsOfBatches()
        full, full_log = build(family, model_dir, default_root_dir=str(tmp_path_factory.mktemp(f"{family}-full")),
                               callbacks=[record])
        full.train()
        _UNINTERRUPTED[family] = (full, full_log, _saves(record))
    return _UNINTERRUPTED[family]


def _kill(family: str, model_dir: str, root: Path, at: int) -> list[Path]:
    """Run the family in ``root`` until SIGKILL before optimizer step ``at``; its checkpoints, newest first."""
    root.mkdir()
    killed = killed_run(family, model_dir, root, at, script=SCRIPT)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (root / "final.pt").exists()
    return sorted((root / "ckpt").glob("*.ckpt"), key=checkpoint_step, reverse=True)


@pytest.mark.parametrize("family", ROUNDS)
def test_kill_inside_a_round_then_resume_from_the_newest_checkpoint_equals_the_uninterrupted_run(
        family, tiny_model_dir, tmp_path, tmp_path_factory):
    full, full_log, saves = _uninterrupted(family, tiny_model_dir, tmp_path_factory)
    # killed before step s, the newest checkpoint is the last one written with global_step < s; pick s where that one
    # lies inside the first epoch (round), so the resumed run crosses the round boundary
    inside = [s for s in range(2, full.trainer.global_step + 1) if (n := _newest(saves, s)) and n[1] == 0 and not n[2]]
    assert inside, f"{family}: no kill point inside the first epoch: {saves}"
    at = random.Random(f"kill -9 mid-round {family}").choice(inside)
    root = tmp_path / "run"
    newest = _kill(family, tiny_model_dir, root, at)[0]
    state = loader_state(newest)
    assert state["epoch"] == 0 and 0 < state["batches"], state
    resumed, log = _resumed(family, tiny_model_dir, root)
    resumed.train(ckpt_path=str(newest))
    where = f"{family}: killed before optimizer step {at} of {full.trainer.global_step}, resumed from {newest.name} " \
            f"({state})"
    _assert_equal_runs(family, where, full, full_log, resumed, log, newest)


@pytest.mark.parametrize("family", ["madpo-iter", "marlhf-iter"])
def test_kill_at_a_rounds_first_step_refuses_the_newest_checkpoint_and_the_one_before_equals_the_run(
        family, tiny_model_dir, tmp_path, tmp_path_factory):
    """Killed at the second round's first optimizer step, the newest checkpoint is the one after the first round's
    last batch, taken before the round's end where the next round is collected: refused, naming the checkpoints to
    use (an epoch-end one, or an earlier one); the newest earlier one resumes to the uninterrupted run."""
    full, full_log, saves = _uninterrupted(family, tiny_model_dir, tmp_path_factory)
    ((last_step, _, _),) = [a for a in saves if a[1] == 0 and a[2]]
    checkpoints = _kill(family, tiny_model_dir, tmp_path / "run", last_step + 1)
    assert checkpoint_step(checkpoints[0]) == last_step, [p.name for p in checkpoints]
    refused, _ = _resumed(family, tiny_model_dir, tmp_path / "run")
    with pytest.raises(ValueError, match=r"after the last batch of epoch 0 but before the epoch's end.*"
                                         r"every_n_epochs=1, save_on_train_epoch_end=True.*earlier checkpoint"):
        refused.train(ckpt_path=str(checkpoints[0]))
    earlier = checkpoints[1]
    resumed, log = _resumed(family, tiny_model_dir, tmp_path / "run")
    resumed.train(ckpt_path=str(earlier))
    where = f"{family}: killed before optimizer step {last_step + 1}, {checkpoints[0].name} refused, resumed from " \
            f"{earlier.name} ({loader_state(earlier)})"
    _assert_equal_runs(family, where, full, full_log, resumed, log, earlier)
