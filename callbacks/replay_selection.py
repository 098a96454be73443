"""ReplaySelection: write each round's replay file and pick the round's training pairs (docs/preference.md §4.1).

Right after IterativePreferenceCollection has handed a round's pairs to the data module, this calls
``datamodule.commit_round(mode, sample_size, k, lam)``: the round is written as
``iteration_{I:04d}.json`` (I = round + 1) and the training pairs become the replay selection. The shard
index and replay RNG live in the data module's state. Logs ``round/total_pairs`` (pairs over all shards)
and ``round/replay_size`` (pairs this round trains on).
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from comlrl_lightning.logging_utils import log_metrics
from comlrl_lightning.protocols import RoundData, check_protocol
from comlrl_lightning.rounds import check_round_setup


class ReplaySelection(L.Callback):
    """Replay policy per round; every argument left None comes from ``pl_module.args``
    (``preference_replay_mode``, ``preference_replay_sample_size``, ``preference_replay_k``,
    ``preference_replay_lambda``)."""

    round_stage = 3
    #: Marks the callback that reads the replay options; the collection callbacks refuse replay options without it.
    selects_replay = True

    def __init__(self, mode: str | None = None, sample_size: int | None = None, k: int | None = None,
                 lam: float | None = None):
        self.mode = mode
        self.sample_size = sample_size
        self.k = k
        self.lam = lam
        self.history: list[dict] = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_round_setup(trainer, "ReplaySelection")
        check_protocol(trainer.datamodule, RoundData, "ReplaySelection", "data module",
                       "IterativePreferenceDataModule")
        args = getattr(pl_module, "args", None)
        if self.mode is None:
            self.mode = getattr(args, "preference_replay_mode", "current")
        for name, opt in (("sample_size", "preference_replay_sample_size"), ("k", "preference_replay_k"),
                          ("lam", "preference_replay_lambda")):
            if getattr(self, name) is None:
                setattr(self, name, getattr(args, opt, None))
        if self.mode == "nearest_k" and self.k is None:
            raise ValueError(
                "ReplaySelection: preference_replay_k is required when preference_replay_mode='nearest_k'.")
        if self.mode == "lambda_decay" and self.lam is None:
            raise ValueError("ReplaySelection: preference_replay_lambda is required when "
                             "preference_replay_mode='lambda_decay'.")

    def _commit(self, trainer: L.Trainer) -> None:
        dm = trainer.datamodule
        if dm.pending_round is None:
            return
        out = dm.commit_round(self.mode, sample_size=self.sample_size, k=self.k, lam=self.lam)
        metrics = {"round/total_pairs": out["total_pairs"], "round/replay_size": out["replay_size"]}
        self.history.append({"iteration": out["iteration"], **metrics})
        # CoMLRL's names (docs/coming-from-comlrl.md)
        log_metrics(trainer, {**metrics, "iter/total_preference_pairs": out["total_pairs"],
                              "iter/train_preference_pairs": out["replay_size"]})
        if out["replay_size"] == 0:
            rank_zero_info(f"MADPOIter: no replay preference pairs were available for iteration {out['iteration']} "
                           f"(current generated {out['num_pairs']}).")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._commit(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._commit(trainer)

    def state_dict(self) -> dict:
        return {"history": [dict(h) for h in self.history]}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = [dict(h) for h in state_dict.get("history", [])]
