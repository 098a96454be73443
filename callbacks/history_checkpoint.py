"""HistoryCheckpoint: per-round policy snapshots (docs/preference.md §3.9).

``<dir>/initial/agent_{i}/`` when training starts and ``<dir>/iteration_{t:04d}/agent_{i}/`` after round t
(0-based, rounds that trained nothing included). Each ``agent_i`` holds an HF ``save_pretrained`` model and
tokenizer, or just the LoRA adapter weights. A snapshot is written into a temporary folder next to its
target and renamed into place, so a crash never leaves a half-written snapshot. ``dir`` is ``dirpath``,
else ``args.policy_checkpoint_dir``, else ``<trainer.default_root_dir>/policy_checkpoints``. The
``history`` comparator reads these snapshots.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import lightning as L

from comlrl_lightning.protocols import TeamModule, check_protocol
from comlrl_lightning.rounds import check_round_setup, output_dir, round_just_finished


class HistoryCheckpoint(L.Callback):
    """Save ``initial`` at fit start and ``iteration_{t:04d}`` after every round t."""

    round_stage = 0

    def __init__(self, dirpath: str | None = None):
        self.dirpath = dirpath
        self.root: Path | None = None
        self.saved: dict[str, str] = {}

    @property
    def state_key(self) -> str:
        return "HistoryCheckpoint"

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_round_setup(trainer, "HistoryCheckpoint")
        check_protocol(pl_module, TeamModule, "HistoryCheckpoint", "module", "MADPOModule")
        configured = self.dirpath or getattr(pl_module.args, "policy_checkpoint_dir", None)
        self.root = output_dir(trainer, configured, "policy_checkpoints")

    def save(self, pl_module: L.LightningModule, name: str) -> Path:
        """Write ``root/name/agent_{i}`` atomically (temp folder + rename); returns the folder."""
        target = self.root / name
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=self.root))
        try:
            pl_module.team.save(tmp)
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.saved[name] = str(target)
        return target

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if "initial" not in self.saved and trainer.is_global_zero:
            self.save(pl_module, "initial")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        t = round_just_finished(trainer, pl_module)
        name = None if t is None else f"iteration_{t:04d}"
        if name is not None and name not in self.saved and trainer.is_global_zero:
            self.save(pl_module, name)

    def state_dict(self) -> dict:
        return {"root": str(self.root) if self.root else None, "saved": dict(self.saved)}

    def load_state_dict(self, state_dict: dict) -> None:
        saved = dict(state_dict.get("saved", {}))
        missing = [p for p in saved.values() if not Path(p).is_dir()]
        if missing:
            raise FileNotFoundError(f"HistoryCheckpoint: the checkpoint's policy snapshots are missing: {missing}. "
                                    "Keep the policy_checkpoint_dir of the run you resume.")
        self.saved = saved
