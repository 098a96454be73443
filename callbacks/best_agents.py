"""BestAgents: keep the agents that scored best in the task-reward evaluation, not only the last ones.

A ``TaskRewardEvaluation`` evaluates the current weights before every ``eval_interval``-th update and once at the
end of training. After each evaluation, this callback compares its ``monitor`` value (default
``eval/reward_mean``) with the best so far and, when it is better, writes the weights that were evaluated to
``<run>/best_agents/agent_{i}/`` (from_pretrained-loadable, as ``ExportAgents``) with ``best.json`` (the value,
the update, the env step). A Lightning ``ModelCheckpoint`` monitoring ``eval/reward_mean`` is not the same: it saves
at the end of a batch, after the update that followed the evaluation, so it would keep weights one update newer
than the ones that scored.

List it after ``TaskRewardEvaluation`` (it reads that callback's evaluations in the same hook; ``setup`` checks).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info


class BestAgents(L.Callback):
    """Write the best-scoring agents to ``<run>/<dirname>/`` (see the module docstring).

    Args:
        monitor: the evaluation metric to compare (a key the evaluation logs, e.g. ``eval/reward_mean``).
        mode: "max" (higher is better) or "min".
        dirname: the folder under the run's versioned folder (``trainer.log_dir``); or an absolute path.
    """

    def __init__(self, monitor: str = "eval/reward_mean", mode: Literal["max", "min"] = "max",
                 dirname: str = "best_agents"):
        if mode not in ("max", "min"):
            raise ValueError(f"BestAgents: mode must be 'max' or 'min'. Got {mode!r}. Allowed: 'max', 'min'.")
        self.monitor, self.mode, self.dirname = monitor, mode, dirname
        self.best: float | None = None
        self.best_update: int | None = None
        self._seen = 0
        self._evaluation: Any = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        evaluations = [i for i, cb in enumerate(trainer.callbacks) if hasattr(cb, "history")
                       and hasattr(cb, "before_after")]
        mine = trainer.callbacks.index(self)
        if not evaluations or evaluations[0] > mine:
            raise ValueError("BestAgents needs a TaskRewardEvaluation listed before it in the Trainer's callbacks "
                             "(it keeps the agents of the best evaluation). Add TaskRewardEvaluation first.")
        self._evaluation = trainer.callbacks[evaluations[0]]
        self._seen = len(self._evaluation.history)

    def folder(self, trainer: L.Trainer) -> Path:
        """Where the best agents go."""
        path = Path(self.dirname)
        return path if path.is_absolute() else Path(trainer.log_dir or trainer.default_root_dir) / path

    def _check(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        history = self._evaluation.history if self._evaluation is not None else []
        new, self._seen = history[self._seen:], len(history)
        for update, metrics in new:
            if self.monitor not in metrics:
                raise ValueError(f"BestAgents: monitor={self.monitor!r} is not among the evaluation's metrics "
                                 f"{sorted(metrics)}. Set monitor to one of them.")
            value = float(metrics[self.monitor])
            better = self.best is None or (value > self.best if self.mode == "max" else value < self.best)
            if better and update == pl_module.updates_seen:  # the weights evaluated are the current ones
                self.best, self.best_update = value, int(update)
                if trainer.is_global_zero:
                    self._save(trainer, pl_module, value, update)

    def _save(self, trainer: L.Trainer, pl_module: L.LightningModule, value: float, update: int) -> None:
        out = self.folder(trainer)
        pl_module.save_agents(str(out))
        record = {"monitor": self.monitor, "mode": self.mode, "value": value, "update": int(update),
                  "env_step": int(getattr(pl_module, "env_step", 0)), "global_step": int(trainer.global_step)}
        (out / "best.json").write_text(json.dumps(record, indent=2) + "\n")
        rank_zero_info(f"[best agents] {self.monitor}={value:.4f} at update {update}: saved under {out}")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._check(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._check(trainer, pl_module)

    def state_dict(self) -> dict:
        return {"best": self.best, "best_update": self.best_update}

    def load_state_dict(self, state_dict: dict) -> None:
        self.best, self.best_update = state_dict.get("best"), state_dict.get("best_update")
