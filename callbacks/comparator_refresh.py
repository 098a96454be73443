"""ComparatorRefresh: get the comparator ready before each round's collection, free it after.

``prepare(round_index)`` runs at every round boundary (``on_fit_start`` for round 0, ``on_train_epoch_end``
of round t's last epoch for round t+1), before IterativePreferenceCollection samples; ``release()`` runs
in the next ``on_train_epoch_start``, once the round's pairs exist. This is what rebuilds the
``current_copy`` copy per round and loads the right ``history`` snapshot. At the end of the run (teardown, and on
an exception or Ctrl-C) it calls the comparator's ``close()``, which frees what is kept across rounds (e.g. the
vLLM engine of a ``model`` comparator). The comparator is the round
data's (``datamodule.comparator_for``): the one configured under ``data:``, the ``comparator`` argument
given here (handed to the data module), or the source built from the module's ``args``.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from comlrl_lightning.protocols import RoundData, check_protocol
from comlrl_lightning.rounds import check_round_setup, next_round_at_epoch_end


class ComparatorRefresh(L.Callback):
    """Call the comparator's ``prepare(round_index)`` / ``release()`` around each collection phase.

    Args:
        comparator: kept for existing code; prefer the data module's ``comparator``. When given, it becomes
            the data module's comparator (a different one configured there is an error).
    """

    round_stage = 1

    def __init__(self, comparator: Any = None):
        self.comparator = comparator
        self.next_round = 0
        self.prepared: int | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_round_setup(trainer, "ComparatorRefresh")
        check_protocol(trainer.datamodule, RoundData, "ComparatorRefresh", "data module",
                       "IterativePreferenceDataModule")
        trainer.datamodule.offer_comparator(self.comparator, "ComparatorRefresh(comparator=...)")

    def _prepare(self, trainer: L.Trainer, pl_module: L.LightningModule, round_index: int) -> None:
        self.comparator = trainer.datamodule.comparator_for(trainer, pl_module)
        if hasattr(self.comparator, "prepare"):
            self.comparator.prepare(round_index)
        self.prepared = round_index
        self.next_round = round_index + 1

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.next_round == 0:
            self._prepare(trainer, pl_module, 0)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        nxt = next_round_at_epoch_end(trainer, pl_module)
        if nxt is not None and nxt == self.next_round:
            self._prepare(trainer, pl_module, nxt)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.prepared is not None and hasattr(self.comparator, "release"):
            self.comparator.release()
        self.prepared = None

    def _close(self) -> None:
        close = getattr(self.comparator, "close", None)
        if callable(close):
            close()
        self.prepared = None

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._close()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._close()

    def state_dict(self) -> dict:
        return {"next_round": self.next_round}

    def load_state_dict(self, state_dict: dict) -> None:
        self.next_round = int(state_dict.get("next_round", 0))
