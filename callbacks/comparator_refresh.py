"""ComparatorRefresh: get the comparator ready before each round's collection, free it after.

``prepare(round_index)`` runs at every round boundary (``on_fit_start`` for round 0, ``on_train_epoch_end``
of round t's last epoch for round t+1), before IterativePreferenceCollection samples; ``release()`` runs
in the next ``on_train_epoch_start``, once the round's pairs exist. This is what rebuilds the
``current_copy`` copy per round and loads the right ``history`` snapshot. The comparator is the
``comparator`` argument, else ``pl_module.comparator``, else one built from ``pl_module.args``.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from comlrl_lightning.callbacks.iterative_collection import resolve_comparator
from comlrl_lightning.callbacks.rounds import check_round_setup, next_round_at_epoch_end


class ComparatorRefresh(L.Callback):
    """Call the comparator's ``prepare(round_index)`` / ``release()`` around each collection phase."""

    round_stage = 1

    def __init__(self, comparator: Any = None):
        self.comparator = comparator
        self.next_round = 0
        self.prepared: int | None = None

    @property
    def state_key(self) -> str:
        return "ComparatorRefresh"

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_round_setup(trainer, "ComparatorRefresh")
        self.comparator = resolve_comparator(pl_module, self.comparator, trainer)

    def _prepare(self, round_index: int) -> None:
        if hasattr(self.comparator, "prepare"):
            self.comparator.prepare(round_index)
        self.prepared = round_index
        self.next_round = round_index + 1

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.next_round == 0:
            self._prepare(0)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        nxt = next_round_at_epoch_end(trainer, pl_module)
        if nxt is not None and nxt == self.next_round:
            self._prepare(nxt)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.prepared is not None and hasattr(self.comparator, "release"):
            self.comparator.release()
        self.prepared = None

    def state_dict(self) -> dict:
        return {"next_round": self.next_round}

    def load_state_dict(self, state_dict: dict) -> None:
        self.next_round = int(state_dict.get("next_round", 0))
