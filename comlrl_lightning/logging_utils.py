"""Log from any hook: Lightning's ``self.log`` is not allowed everywhere (e.g. ``on_train_end``)."""

from __future__ import annotations

import torch


def log_metrics(trainer, metrics: dict[str, float], step: int | None = None) -> None:
    """Send ``metrics`` to every logger at ``step`` (default: the global step) and to callback_metrics."""
    if not metrics:
        return
    step = trainer.global_step if step is None else step
    clean = {k: float(v) for k, v in metrics.items()}
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(clean, step=step)
    for k, v in clean.items():
        trainer.callback_metrics[k] = torch.tensor(v)
