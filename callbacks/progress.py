"""A TQDM progress bar that shows counts as integers.

Lightning turns every value given to ``self.log`` into a float tensor, and its TQDM bar pads floats to a fixed
width, so a count such as the number of preference pairs reads ``pairs: 424.000``. :class:`TeamProgressBar`
shows the keys named in ``count_keys`` as integers (``pairs: 424``) when their value is integral; every other
metric is shown as Lightning shows it.

The CLI and the trainer facades add it whenever the progress bar is enabled and no other progress bar was
given; a bar of your own (``trainer.callbacks``) takes its place.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lightning.pytorch.callbacks import TQDMProgressBar

#: The counts our modules put in the bar.
COUNT_KEYS = ("pairs", "env_step", "round", "updates")


def integral_counts(metrics: dict[str, Any], count_keys: Iterable[str]) -> dict[str, Any]:
    """``metrics`` with each value under a key of ``count_keys`` that is an integral float turned into an
    ``int``; other values unchanged."""
    keys = set(count_keys)
    return {k: int(v) if k in keys and isinstance(v, float) and v.is_integer() else v for k, v in metrics.items()}


class TeamProgressBar(TQDMProgressBar):
    """Lightning's TQDM bar, with the counts of ``count_keys`` shown as integers.

    Args:
        refresh_rate: Batches between refreshes (as ``TQDMProgressBar``).
        leave: Keep the finished epoch's bar on screen (as ``TQDMProgressBar``).
        count_keys: Progress-bar keys whose values are counts.
    """

    def __init__(self, refresh_rate: int = 1, leave: bool = False, count_keys: Iterable[str] = COUNT_KEYS):
        super().__init__(refresh_rate=refresh_rate, leave=leave)
        self.count_keys = tuple(count_keys)

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        return integral_counts(super().get_metrics(trainer, pl_module), self.count_keys)


def with_progress_bar(callbacks: list, enabled: Any) -> list:
    """``callbacks`` plus a :class:`TeamProgressBar` when the bar is ``enabled`` (Lightning's default: True)
    and ``callbacks`` holds no progress bar."""
    from lightning.pytorch.callbacks.progress import ProgressBar

    if enabled is False or any(isinstance(cb, ProgressBar) for cb in callbacks):
        return callbacks
    return [*callbacks, TeamProgressBar()]
