"""HistoryCheckpoint: per-round policy snapshots (docs/preference.md §3.9).

``<dir>/initial/agent_{i}/`` when training starts and ``<dir>/iteration_{t:04d}/agent_{i}/`` after round t
(0-based, rounds that trained nothing included). Each ``agent_i`` holds an HF ``save_pretrained`` model and
tokenizer, or just the LoRA adapter weights. A snapshot is written into a temporary folder next to its
target and renamed into place, so a crash never leaves a half-written snapshot. ``dir`` is ``dirpath``,
else ``args.policy_checkpoint_dir``, else ``<trainer.default_root_dir>/policy_checkpoints``. The
``history`` comparator reads these snapshots.

The checkpoint state names the snapshots relative to that folder (``initial``, ``iteration_0000``, ...), never by
absolute path: a run folder copied elsewhere and resumed there uses, and checks, its own snapshots.
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
        self.saved[name] = name
        return target

    def _snapshot(self, trainer: L.Trainer, pl_module: L.LightningModule, name: str) -> None:
        """Rank 0 writes the snapshot; every rank waits for it, since every rank's comparator may load it next
        (the replicas are identical, so one copy serves all; docs/scaling.md)."""
        if trainer.is_global_zero:
            self.save(pl_module, name)
        else:
            self.saved[name] = name
        trainer.strategy.barrier(f"HistoryCheckpoint {name}")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if "initial" not in self.saved:
            self._snapshot(trainer, pl_module, "initial")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        t = round_just_finished(trainer, pl_module)
        name = None if t is None else f"iteration_{t:04d}"
        if name is not None and name not in self.saved:
            self._snapshot(trainer, pl_module, name)

    def state_dict(self) -> dict:
        # snapshot names only: the folder is resolved again by the run that loads the state (see module docstring)
        return {"saved": {name: name for name in self.saved}}

    def load_state_dict(self, state_dict: dict) -> None:
        # older states held absolute paths: only the snapshot's name is kept, resolved under this run's folder
        saved = {name: Path(p).name for name, p in dict(state_dict.get("saved", {})).items()}
        if self.root is not None:
            missing = [str(self.root / p) for p in saved.values() if not (self.root / p).is_dir()]
            if missing:
                raise FileNotFoundError(
                    f"HistoryCheckpoint: the checkpoint's policy snapshots are missing: {missing}. Resume with the "
                    "policy_checkpoint_dir (or default_root_dir) of the run that wrote the checkpoint, or a copy "
                    "of it.")
        self.saved = saved
