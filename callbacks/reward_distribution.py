"""RewardDistributionLogger: per-round histograms of raw rewards (docs/preference.md §3.8).

After a round's pairs are collected and its training pairs selected, writes
``<dir>/iteration_{I:04d}.json`` (I = round + 1) with the "candidate" distribution (raw rewards of every
current and comparator candidate of the round) and the "selected" one (``target_raw_reward`` /
``comparator_raw_reward`` of the round's training pairs, replayed ones included), and logs the scalar keys
``iter/reward_distribution/...`` and ``iter/selected_reward_distribution/...``; with a ``WandbLogger`` also
the line and bar charts as W&B HTML. Needs ``reward_func.reward_range`` (checked in ``setup``).
"""

from __future__ import annotations

import lightning as L

from comlrl_lightning.distributions import (
    distribution_record,
    resolve_reward_range,
    round_metrics,
    svg_chart,
    write_record,
)
from comlrl_lightning.logging_utils import log_metrics
from comlrl_lightning.protocols import RoundData, check_protocol
from comlrl_lightning.rounds import check_round_setup, output_dir


class RewardDistributionLogger(L.Callback):
    """Write and log the round's reward distributions (list it after ReplaySelection).

    Args:
        dirpath: output folder (default ``<default_root_dir>/reward_distributions``).
    """

    round_stage = 4

    def __init__(self, dirpath: str | None = None):
        self.dirpath = dirpath
        self.logged_round = -1
        self.range: tuple[float, float] | None = None
        self.files: list[str] = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_round_setup(trainer, "RewardDistributionLogger")
        dm = trainer.datamodule
        check_protocol(dm, RoundData, "RewardDistributionLogger", "data module", "IterativePreferenceDataModule")
        self.range = resolve_reward_range(dm.oracle.reward_func)

    def _maybe_log(self, trainer: L.Trainer) -> None:
        dm = trainer.datamodule
        cand = dm.candidate_raw_rewards
        if not cand or cand["round"] <= self.logged_round:
            return
        self.logged_round = cand["round"]
        lo, hi = self.range
        selected = {"target": [p.target_raw_reward for p in dm.pairs if p.target_raw_reward is not None],
                    "comparator": [p.comparator_raw_reward for p in dm.pairs if p.comparator_raw_reward is not None]}
        record = distribution_record(cand["round"] + 1, lo, hi, cand, selected)
        # the round's rewards were gathered from every rank: rank 0 alone writes the file
        path = write_record(output_dir(trainer, self.dirpath, "reward_distributions"), record) \
            if trainer.is_global_zero else None
        if path is not None:
            self.files.append(str(path))
        metrics = {**round_metrics(record, "candidate"), **round_metrics(record, "selected", len(dm.pairs))}
        log_metrics(trainer, metrics)
        self._log_charts(trainer, record)

    def _log_charts(self, trainer: L.Trainer, record: dict) -> None:
        from lightning.pytorch.loggers import WandbLogger

        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger) and trainer.is_global_zero:
                import wandb

                tag = f"iteration_{record['iteration']:04d}"
                charts = {}
                for kind, ns in (("candidate", "iter/reward_distribution"),
                                 ("selected", "iter/selected_reward_distribution")):
                    for style in ("line", "bar"):
                        charts[f"{ns}/{tag}/{style}_plot"] = wandb.Html(svg_chart(record, kind, style))
                logger.experiment.log(charts)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._maybe_log(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._maybe_log(trainer)

    def state_dict(self) -> dict:
        return {"logged_round": self.logged_round, "files": list(self.files)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.logged_round = int(state_dict.get("logged_round", -1))
        self.files = list(state_dict.get("files", []))
