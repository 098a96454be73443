"""Small builders shared by the iterative-training tests (tasks, configs, a MADPOIterTrainer, a step recorder)."""

from __future__ import annotations

import lightning as L
from conftest import cpu_trainer_kwargs

from comlrl_lightning.config import MADPOIterConfig
from comlrl_lightning.data.madpo import IterativePreferenceDataModule
from comlrl_lightning.data.sources import load_task_items
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.modules.madpo import MADPOModule


def task_items(n: int = 6) -> list[dict]:
    return load_task_items("builtin:cooperative")[:n]


def iter_args(**overrides) -> MADPOIterConfig:
    kw = {"num_iterations": 2, "preference_num_candidates": 4, "preference_pairs_per_sample": 2, "train_batch_size": 4,
              "max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0, "top_k": None, "agent_learning_rate": 1e-2,
              "eval_interval": 0, "eval_num_samples": 2, "seed": 0}
    kw.update(overrides)
    return MADPOIterConfig(**kw)


def make_trainer(model_dir, root, args=None, num_items: int = 6, reward_func=cooperative_reward, callbacks=(),
                 trainer_kwargs=None, **kw):
    from comlrl_lightning.trainers.madpo import MADPOIterTrainer

    tk = cpu_trainer_kwargs(default_root_dir=str(root))
    tk.update(trainer_kwargs or {})
    return MADPOIterTrainer(agent_model=str(model_dir), train_dataset=task_items(num_items), eval_dataset=None,
                            reward_func=reward_func, formatters=FORMATTERS, args=args or iter_args(),
                            evaluation=False, callbacks=callbacks, trainer_kwargs=tk, **kw)


class StepRecorder(L.Callback):
    """Per-step losses and each epoch's training pairs (as JSON records)."""

    def __init__(self):
        self.losses: list[tuple[int, float]] = []
        self.epoch_pairs: dict[int, list[dict]] = {}

    def on_train_epoch_start(self, trainer, pl_module):
        self.epoch_pairs[trainer.current_epoch] = [p.to_json() for p in trainer.datamodule.pairs]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append((trainer.current_epoch, float(loss)))


def _plain_parts(model_dir, tmp_path, args):
    module = MADPOModule(agent_model=str(model_dir), args=args)
    dm = IterativePreferenceDataModule(train_dataset=task_items(4), eval_dataset=None, reward_func=cooperative_reward,
                                       formatters=FORMATTERS, num_agents=2, replay_dir=str(tmp_path / "replay"))
    return module, dm
