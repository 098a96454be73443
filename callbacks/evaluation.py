"""TaskRewardEvaluation: sample the current policies on eval items and score with the task reward only.

Runs before every ``eval_interval``-th update (update 0 included, as upstream) and once at the end of
training. Logs ``eval/reward_mean``, ``eval/turn_{t}/reward_mean``, ``eval/turn_{t}/expected_return`` and,
single-turn, ``eval/agent{i}/completions/mean_length`` (tokens); with CoMLRL's ``eval_logger`` and
``eval_aggregator``, their metrics as ``eval/<key>``. What an evaluation samples is the
module's business (``pl_module.evaluate``, the ``TeamModule`` protocol): multi-turn modules roll out every
turn on single sampled paths (docs/multiturn.md §10.2).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from comlrl_lightning.evaluation import (
    custom_eval_metrics,
    evaluate_team,  # noqa: F401  (kept importable from here)
)
from comlrl_lightning.logging_utils import log_metrics
from comlrl_lightning.protocols import TaskSource, TeamModule, check_protocol


class TaskRewardEvaluation(L.Callback):
    """Evaluate with the task reward (never a learned reward).

    Args:
        eval_interval: evaluate before every k-th update (0 = only at the end); None = ``args.eval_interval``.
        eval_num_samples: eval items used (the first ones); None = ``args.eval_num_samples``.
        samples_per_item: sampled joint responses per item (more = less noisy estimate).
        seed: base seed of the evaluation streams; every evaluation uses the same seeds so that runs and
            evaluations are comparable.
        final: also evaluate at the end of training.
        eval_logger: CoMLRL's ``eval_logger(agent_completions_turns=, batch_items=, prompts=)`` -> one metrics
            dict per item; used together with ``eval_aggregator``.
        eval_aggregator: CoMLRL's ``eval_aggregator(metrics, num_turns=)`` -> a dict logged as ``eval/<key>``.
    """

    def __init__(self, eval_interval: int | None = None, eval_num_samples: int | None = None,
                 samples_per_item: int = 1, seed: int = 12345, final: bool = True,
                 eval_logger: Callable | None = None, eval_aggregator: Callable | None = None):
        if (eval_logger is None) != (eval_aggregator is None):
            given = "eval_logger" if eval_logger is not None else "eval_aggregator"
            missing = "eval_aggregator" if eval_logger is not None else "eval_logger"
            warnings.warn(f"{given} is ignored without {missing}: custom evaluation metrics need both (as in "
                          f"CoMLRL). Pass {missing}=... too.", UserWarning, stacklevel=2)
        self.eval_logger = eval_logger
        self.eval_aggregator = eval_aggregator
        self._warned_no_completions = False
        self.eval_interval = eval_interval
        self.eval_num_samples = eval_num_samples
        self.samples_per_item = samples_per_item
        self.seed = seed
        self.final = final
        self.history: list[tuple[int, dict]] = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Check the module and the data module, and hand the module this callback's ``seed`` and
        ``samples_per_item`` (``use_evaluation_settings``): ``validate`` / ``test`` then evaluate as this callback
        does, so that ``validate`` reproduces the ``after`` number of ``fit``."""
        check_protocol(pl_module, TeamModule, "TaskRewardEvaluation", "module", "MADPOModule")
        check_protocol(trainer.datamodule, TaskSource, "TaskRewardEvaluation", "data module", "TaskDataModule")
        pl_module.use_evaluation_settings(seed=self.seed, samples_per_item=self.samples_per_item)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Hand the module its default evaluation settings back: a later run without this callback evaluates as
        one that never had it."""
        pl_module.use_evaluation_settings()

    @property
    def before_after(self) -> tuple[float, float] | None:
        """(first, last) ``eval/reward_mean`` of this fit, or None before two evaluations exist."""
        values = [m["eval/reward_mean"] for _, m in self.history if "eval/reward_mean" in m]
        return (values[0], values[-1]) if values else None

    def _run(self, trainer: L.Trainer, pl_module: L.LightningModule, label: str) -> dict:
        dm = trainer.datamodule
        args = pl_module.args
        n = args.eval_num_samples if self.eval_num_samples is None else self.eval_num_samples
        items = list(dm.eval_items[:n])
        if not items:
            return {}
        metrics = pl_module.evaluate(items, dm, seed=self.seed, samples_per_item=self.samples_per_item)
        if self.eval_logger is not None and self.eval_aggregator is not None:
            if getattr(metrics, "completions", None) is None and not self._warned_no_completions:
                self._warned_no_completions = True
                warnings.warn(f"eval_logger/eval_aggregator: {type(pl_module).__name__}'s evaluation records no "
                              "completions, so no custom evaluation metrics are logged.", UserWarning, stacklevel=2)
            turns = int(getattr(args, "num_turns", 1) or 1)
            metrics = {**metrics, **custom_eval_metrics(metrics, self.eval_logger, self.eval_aggregator, turns)}
        self.history.append((pl_module.updates_seen, metrics))
        log_metrics(trainer, metrics)
        rank_zero_info(f"[eval {label}] update {pl_module.updates_seen}: task reward "
                       f"{metrics['eval/reward_mean']:.4f}")
        return metrics

    def state_dict(self) -> dict:
        """The evaluations so far (plain types), so that a resumed run's "before" is the first run's."""
        return {"history": [[int(u), {k: float(v) for k, v in m.items()}] for u, m in self.history]}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = [(int(u), dict(m)) for u, m in state_dict.get("history", [])]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        interval = pl_module.args.eval_interval if self.eval_interval is None else self.eval_interval
        # a step of the RL trainers holds an update window of several items: evaluate before it when it holds an
        # interval-th update (its items are sampled by the weights evaluated here; docs/multiturn.md §2.11)
        start = pl_module.updates_seen
        if interval > 0 and -(-start // interval) * interval < start + max(1, pl_module.updates_in_batch(batch)):
            self._run(trainer, pl_module, "periodic")

    def on_train_end(self, trainer, pl_module) -> None:
        if self.final:
            self._run(trainer, pl_module, "final")
