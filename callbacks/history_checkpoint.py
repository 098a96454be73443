"""HistoryCheckpoint: per-round policy snapshots (docs/preference.md §3.9).

``<dir>/initial/agent_{i}/`` when training starts and ``<dir>/iteration_{t:04d}/agent_{i}/`` after round t
(0-based, rounds that trained nothing included). Each ``agent_i`` holds an HF ``save_pretrained`` model and
tokenizer, or just the LoRA adapter weights. A snapshot is written into a temporary folder next to its
target, then swapped into place (:func:`~comlrl_lightning.files.replace_dir`: write new, rename over, delete old), so
a crash at any moment leaves a complete snapshot, the old or the new one; what a crash left (a temporary or an old
folder) is cleaned up or put back at the next setup. One run per folder: the folder is locked for the run
(:class:`~comlrl_lightning.files.RunLock`), and a second live run on it is refused with a message naming the first.
``dir`` is ``dirpath``, else ``args.policy_checkpoint_dir``, else ``<trainer.default_root_dir>/policy_checkpoints``.
The ``history`` comparator reads these snapshots.

The checkpoint state names the snapshots relative to that folder (``initial``, ``iteration_0000``, ...), never by
absolute path: a run folder copied elsewhere and resumed there uses, and checks, its own snapshots.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import lightning as L

from comlrl_lightning.files import RunLock, recover_dirs, replace_dir
from comlrl_lightning.protocols import TeamModule, check_protocol
from comlrl_lightning.rounds import check_round_setup, output_dir, round_just_finished
from comlrl_lightning.sharding import save_team, team_is_sharded


class HistoryCheckpoint(L.Callback):
    """Save ``initial`` at fit start and ``iteration_{t:04d}`` after every round t."""

    round_stage = 0

    def __init__(self, dirpath: str | None = None):
        self.dirpath = dirpath
        self.root: Path | None = None
        self.saved: dict[str, str] = {}
        self._lock: RunLock | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_round_setup(trainer, "HistoryCheckpoint")
        check_protocol(pl_module, TeamModule, "HistoryCheckpoint", "module", "MADPOModule")
        configured = self.dirpath or getattr(pl_module.args, "policy_checkpoint_dir", None)
        self.root = output_dir(trainer, configured, "policy_checkpoints")
        if trainer.is_global_zero and stage == "fit":
            self._lock = RunLock(self.root, "policy snapshot", "policy_checkpoint_dir")
            self._lock.acquire()
            recover_dirs(self.root)
            for tmp in self.root.glob(".*.new.*"):  # a snapshot a killed run was writing: never complete
                shutil.rmtree(tmp, ignore_errors=True)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._release()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._release()

    def _release(self) -> None:
        lock, self._lock = getattr(self, "_lock", None), None
        if lock is not None:
            lock.release()

    def save(self, pl_module: L.LightningModule, name: str, writes: bool = True) -> Path:
        """Write ``root/name/agent_{i}`` atomically (temp folder, then :func:`replace_dir`); returns the folder.

        Sharded agents (FSDP2, docs/scaling.md "FSDP2"): every rank calls it, each agent's whole weights are gathered
        (:func:`~comlrl_lightning.sharding.save_team`, a collective) and only the rank with ``writes`` (rank 0)
        writes the folder."""
        target = self.root / name
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.new.", dir=self.root)) if writes else None
        try:
            if team_is_sharded(pl_module):
                save_team(pl_module, str(tmp) if writes else "", critics=False)
            else:
                pl_module.team.save(tmp)
            if writes:
                replace_dir(tmp, target)
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.saved[name] = name
        return target

    def _snapshot(self, trainer: L.Trainer, pl_module: L.LightningModule, name: str) -> None:
        """Rank 0 writes the snapshot; every rank waits for it, since every rank's comparator may load it next
        (the replicas are identical, so one copy serves all; docs/scaling.md). Sharded agents are gathered on every
        rank first (:meth:`save`)."""
        if team_is_sharded(pl_module):
            self.save(pl_module, name, writes=trainer.is_global_zero)
        elif trainer.is_global_zero:
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
