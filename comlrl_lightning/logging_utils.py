"""Logging beside ``self.log``, and training metrics written only on the steps that pass a gate (``logging_steps``).

:class:`StepMetrics` is the Lightning-native path: a module's training metrics go through ``self.log`` and appear
only on the gated steps (MADPO). :func:`log_metrics` writes to the loggers directly, for two cases ``self.log``
cannot express: hooks where Lightning refuses ``self.log`` (``on_fit_start``, ``on_train_end``, the round callbacks,
the drains at ``on_train_epoch_end``), and rows that must stay separate at one step: the MAGRPO family and IAC/MAAC
write one entry per (agent, turn group) per drain (docs/multiturn.md §10.1), several at the same step with the
same keys (``train/loss``, ``env_step``), which ``self.log`` would merge into one value. Those rows use the x axis
of ``self.log`` (:func:`logged_step`), so both kinds line up in one ``metrics.csv``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import lightning as L
import torch
from torch import nn
from torchmetrics import Metric


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


class StepValue(Metric):
    """The value of one training metric at the current step, or none: ``forward(value)`` gives it, ``reset()``
    takes it away. Logged with ``self.log(name, metric, on_step=True, on_epoch=False)`` on every step, Lightning
    writes the value on the steps that gave one and nothing on the others (a tensor would be written again at
    every later step of the epoch: tests/modules/test_step_metrics.py). float64, so loggers get the float given."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self._value = 0.0

    def update(self, value: float) -> None:
        self._value = float(value)

    def compute(self) -> torch.Tensor:
        return torch.tensor(self._value, dtype=torch.float64)


class StepMetrics(nn.Module):
    """A module's gated training metrics, named once: :meth:`log_to` logs each through Lightning every training step,
    with this step's value or none (nothing is written then). No state of its own in the checkpoint."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__()
        self.names = list(names)
        self.values = nn.ModuleList(StepValue() for _ in self.names)

    def log_to(self, module: L.LightningModule, metrics: Mapping[str, float] | None) -> None:
        """``module.log`` every metric from ``training_step``: ``metrics`` (a value for every name) on a step that
        passed the gate, None on one that did not."""
        for name, metric in zip(self.names, self.values):
            metric.reset()
            if metrics is not None:
                metric(metrics[name])
            module.log(name, metric, on_step=True, on_epoch=False)
