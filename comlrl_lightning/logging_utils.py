"""Log from any hook: Lightning's ``self.log`` is not allowed everywhere (e.g. ``on_train_end``)."""

from __future__ import annotations

import torch


def logged_step(trainer) -> int:
    """The step ``self.log`` metrics are written at: the number of training batches that stepped (one per
    update), not ``trainer.global_step`` (which counts every optimizer step of every agent: N per update)."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    return int(getattr(loop, "_batches_that_stepped", trainer.global_step))


def log_metrics(trainer, metrics: dict[str, float], step: int | None = None) -> None:
    """Send ``metrics`` to every logger at ``step`` (default: :func:`logged_step`, the x axis of ``self.log``'s
    metrics) and to callback_metrics."""
    if not metrics:
        return
    step = logged_step(trainer) if step is None else step
    clean = {k: float(v) for k, v in metrics.items()}
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(clean, step=step)
    for k, v in clean.items():
        trainer.callback_metrics[k] = torch.tensor(v)
