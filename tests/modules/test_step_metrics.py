"""Training metrics under the ``logging_steps`` gate go through ``self.log`` (issue 30 item 5).

The gate logs on some training steps only. Lightning keeps a value given to ``self.log(..., on_step=True)`` until the
epoch ends and writes it again at every later step that logs nothing: the first test shows it on a bare
LightningModule. :class:`~comlrl_lightning.logging_utils.StepMetrics` logs a metric object every step, which writes
nothing on a step that gave it no value.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger

from comlrl_lightning.logging_utils import StepMetrics


class Recorder(Logger):
    """Every ``log_metrics`` call, in order (Lightning's ``epoch`` convenience key left out)."""

    name, version, experiment = "recorder", 0, None

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, {k: v for k, v in metrics.items() if k != "epoch"}))

    def log_hyperparams(self, *args, **kwargs):
        pass


class Gated(L.LightningModule):
    """Logs ``x`` = 0.1 * batch index on every ``every``-th training step only, as tensors or through StepMetrics."""

    def __init__(self, every: int, step_metrics: bool):
        super().__init__()
        self.automatic_optimization = False
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.every = every
        self.step_metrics = StepMetrics(["x", "y"]) if step_metrics else None

    def training_step(self, batch, batch_idx):
        values = {"x": 0.1 * batch_idx, "y": 1.0 / 3 + batch_idx} if batch_idx % self.every == 0 else None
        if self.step_metrics is not None:
            self.step_metrics.log_to(self, values)
        elif values is not None:
            self.log_dict(values, on_step=True, on_epoch=False)

    def configure_optimizers(self):
        return torch.optim.SGD([self.w], lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.zeros(7, 1))


def fit(module: L.LightningModule, epochs: int = 1) -> list[tuple[int, dict]]:
    logger = Recorder()
    L.Trainer(max_epochs=epochs, logger=logger, log_every_n_steps=1, enable_progress_bar=False,
              enable_checkpointing=False, enable_model_summary=False, accelerator="cpu").fit(module)
    return logger.rows


def test_a_gated_tensor_log_is_written_again_at_every_later_step():
    rows = fit(Gated(every=3, step_metrics=False))
    assert [s for s, _ in rows] == [0, 1, 2, 3, 4, 5, 6]  # a row at every step, though 3 steps logged
    assert [m["x"] for _, m in rows] == pytest.approx([0.0, 0.0, 0.0, 0.3, 0.3, 0.3, 0.6])  # stale values


@pytest.mark.parametrize("every", [1, 3])
def test_step_metrics_write_only_the_steps_that_logged_with_their_exact_values(every):
    rows = fit(Gated(every=every, step_metrics=True), epochs=2)
    steps = [s for s in range(14) if (s % 7) % every == 0]
    assert [s for s, _ in rows] == steps
    # float64 all the way: the logger gets the Python float given, as logging_utils.log_metrics wrote it
    assert [m for _, m in rows] == [{"x": 0.1 * (s % 7), "y": 1.0 / 3 + (s % 7)} for s in steps]
