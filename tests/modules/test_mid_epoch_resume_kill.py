"""kill -9 at a random point of a batch, then resume from the newest checkpoint in the same folder (in the test's process): the weights equal
the uninterrupted run's and the rerun takes only the steps after the checkpoint (issue 31 item 3), for the MAGRPO
family (1 and 2 turns, centralized), IAC, MAAC, MADPO and MADPOIter.

The training process (tests/modules/mid_epoch_kill_script.py) checkpoints after every batch and sends itself SIGKILL
just before an optimizer step drawn at random (seeded per family, so a failure reproduces), i.e. inside a batch:
the newest checkpoint is then the end of the previous batch, usually inside an epoch. When the kill comes before the
first checkpoint, the rerun starts afresh in the folder the killed run left, as a user would."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from test_mid_epoch_resume import FAMILIES, build, loader_state

SCRIPT = Path(__file__).resolve().parent / "mid_epoch_kill_script.py"
ROOT = Path(__file__).resolve().parents[2]


def killed_run(family: str, model_dir: str, root: Path, kill_at: int, script: Path = SCRIPT):
    """Run ``script`` (a fit that kills itself with SIGKILL before optimizer step ``kill_at``) in a subprocess."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled",
           "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(script), family, model_dir, str(root), str(kill_at)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=root)


def checkpoint_step(path: Path) -> int:
    return int(re.search(r"step=(\d+)", path.name).group(1))


class StepCount(L.Callback):
    """Counts the optimizer steps a fit takes."""

    def __init__(self):
        self.steps = 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.steps += 1


@pytest.mark.parametrize("family", list(FAMILIES))
def test_kill_at_a_random_step_then_resume_from_the_newest_checkpoint_equals_the_uninterrupted_run(
        family, tiny_model_dir, tmp_path):
    full, _ = build(family, tiny_model_dir, default_root_dir=str(tmp_path / "full"))
    full.train()
    steps = full.trainer.global_step
    at = random.Random(f"kill -9 {family}").randint(2, steps)  # die just before the at-th optimizer step
    root = tmp_path / "run"
    root.mkdir()
    killed = killed_run(family, tiny_model_dir, root, at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (root / "final.pt").exists()
    checkpoints = sorted((root / "ckpt").glob("*.ckpt"), key=checkpoint_step)
    newest = checkpoints[-1] if checkpoints else None
    # the rerun, in this process (the killed one's state is on disk): the script's trainer, same folder, no kill
    counted = StepCount()
    resumed, _ = build(family, tiny_model_dir, enable_checkpointing=True, default_root_dir=str(root),
                       callbacks=[ModelCheckpoint(dirpath=str(root / "ckpt"), filename="{step}", every_n_train_steps=1,
                                                  save_top_k=-1), counted])
    resumed.train(ckpt_path=str(newest) if newest else None)
    where = f"{family}: killed before optimizer step {at} of {steps}, resumed from " + (
        f"{newest.name} ({loader_state(newest)})" if newest else "scratch")
    print(where)
    # the rerun took only the steps after the checkpoint (a rerun from scratch would end with the same weights)
    assert counted.steps == steps - (checkpoint_step(newest) if newest else 0), where
    final = resumed.module.state_dict()
    for name, value in full.module.state_dict().items():
        assert torch.equal(final[name], value), f"{where}: {name} differs by {(final[name] - value).abs().max()}"
