"""One training process of tests/modules/test_mid_epoch_resume_kill.py (run as a subprocess, so that it can die by
SIGKILL): ``python mid_epoch_kill_script.py FAMILY MODEL_DIR ROOT KILL_AT [CKPT]``.

Trains FAMILY (a job of test_mid_epoch_resume.FAMILIES) in ROOT with a checkpoint after every batch, resumed from
CKPT when given; KILL_AT > 0: the process sends itself SIGKILL just before its KILL_AT-th optimizer step (inside a
batch, between two agents' updates when they fall in one batch). A run that ends writes ROOT/final.pt (weights)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import lightning as L
import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from test_mid_epoch_resume import build  # noqa: E402  (tests/modules on the path)


class KillAt(L.Callback):
    def __init__(self, at: int):
        self.at, self.seen = at, 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.seen += 1
        if self.seen == self.at:
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    family, model_dir, root, kill_at = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    ckpt = sys.argv[5] if len(sys.argv) > 5 else None
    torch.set_num_threads(1)
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(dirpath=str(root / "ckpt"), filename="{step}",
                                                      every_n_train_steps=1, save_top_k=-1)
    callbacks = [checkpoints] + ([KillAt(kill_at)] if kill_at > 0 else [])
    t, _ = build(family, model_dir, enable_checkpointing=True, default_root_dir=str(root), callbacks=callbacks)
    t.train(ckpt_path=ckpt)
    torch.save({k: v.detach().clone() for k, v in t.module.state_dict().items()}, root / "final.pt")


if __name__ == "__main__":
    main()
