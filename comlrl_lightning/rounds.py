"""Round bookkeeping of the round-boundary callbacks and the round data (rounds are Lightning epochs).

With ``E = num_train_epochs`` epochs per round, epoch ``e`` trains round ``e // E``. Round 0 is prepared
in ``on_fit_start``; round ``t + 1`` in ``on_train_epoch_end`` of the last epoch of round ``t`` (Lightning
builds the next train dataloader right after that hook when ``reload_dataloaders_every_n_epochs=1``).

Several callbacks act in the same hook, so their order in ``trainer.callbacks`` matters:
snapshot (HistoryCheckpoint) → comparator (ComparatorRefresh) → pairs (IterativePreferenceCollection) →
replay (ReplaySelection) → reward model / distributions (IterativeRewardModelFit, RewardDistributionLogger).
Each round callback carries a ``round_stage`` and checks the order in ``setup``; callbacks without a stage
(evaluation, export, Lightning's own) may stand anywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def check_round_setup(trainer: Any, name: str) -> None:
    """Raise a clear error when the trainer cannot run rounds as epochs, or round callbacks are misordered."""
    if trainer.reload_dataloaders_every_n_epochs != 1:
        raise ValueError(
            f"{name} needs Trainer(reload_dataloaders_every_n_epochs=1) so that every epoch trains on the pairs "
            f"of its round; got reload_dataloaders_every_n_epochs={trainer.reload_dataloaders_every_n_epochs}. "
            "Pass reload_dataloaders_every_n_epochs=1 to lightning.Trainer."
        )
    staged = [(cb.round_stage, type(cb).__name__) for cb in trainer.callbacks
              if isinstance(getattr(cb, "round_stage", None), int)]
    if [s for s, _ in staged] != sorted(s for s, _ in staged):
        order = ", ".join(n for _, n in sorted(staged, key=lambda x: x[0]))
        raise ValueError(
            f"Round callbacks are in the wrong order: {', '.join(n for _, n in staged)}. They act in the same "
            f"hook and must be listed as: {order}."
        )


def epochs_per_round(pl_module: Any) -> int:
    return int(getattr(pl_module.args, "num_train_epochs", 1))


def num_rounds(pl_module: Any) -> int:
    return int(getattr(pl_module.args, "num_iterations", 1))


def next_round_at_epoch_end(trainer: Any, pl_module: Any) -> int | None:
    """The round to prepare in this ``on_train_epoch_end``, or None (not a round's last epoch, or no rounds left)."""
    e = epochs_per_round(pl_module)
    epoch = trainer.current_epoch
    if (epoch + 1) % e != 0:
        return None
    nxt = epoch // e + 1
    return nxt if nxt < num_rounds(pl_module) else None


def round_just_finished(trainer: Any, pl_module: Any) -> int | None:
    """The round whose last epoch ends in this ``on_train_epoch_end`` (None mid-round)."""
    e = epochs_per_round(pl_module)
    epoch = trainer.current_epoch
    return epoch // e if (epoch + 1) % e == 0 else None


def output_dir(trainer: Any, configured: str | None, kind: str) -> Path:
    """``configured`` if set, else ``<trainer.default_root_dir>/<kind>``; absolute and created."""
    path = Path(configured) if configured else Path(trainer.default_root_dir) / kind
    path = path.absolute()
    path.mkdir(parents=True, exist_ok=True)
    return path
