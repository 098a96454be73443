"""RunFolderLock: one run per round-file folder (issue 31 item 4).

Round files (``iteration_NNNN.json``) live in ``preference_replay_dir``, by default
``<default_root_dir>/preference_replay``: a folder outside Lightning's versioned log folders, which two runs started on
the same root would share, overwriting each other's rounds. The team modules add this callback
(``configure_callbacks``): in ``fit`` it locks the data module's round-file folder (``datamodule.store.directory``,
when the data module keeps one) on the process that writes it, with :class:`~comlrl_lightning.files.RunLock`, so a
second live run on that folder is refused with a message naming the first (pid, host, start time). The lock ends with
the fit, an exception, or the process (a run killed by SIGKILL holds nothing). ``HistoryCheckpoint`` locks its
snapshot folder the same way.
"""

from __future__ import annotations

import lightning as L

from comlrl_lightning.files import RunLock


class RunFolderLock(L.Callback):
    """Lock the data module's round-file folder for the fit (rank 0)."""

    def __init__(self) -> None:
        self._lock: RunLock | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        store = getattr(trainer.datamodule, "store", None) if trainer.datamodule is not None else None
        folder = getattr(store, "directory", None)
        if stage != "fit" or folder is None or not trainer.is_global_zero:
            return
        self._lock = RunLock(folder, "round file (preference replay)", "preference_replay_dir")
        self._lock.acquire()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._release()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._release()

    def _release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()
