"""Exact mid-epoch resume under DDP (2 CPU processes, gloo), run by tests/components/test_ddp_mid_epoch_resume.py.

Usage: ``ddp_mid_epoch_resume_script.py OUT MODEL FAMILY MODE``. ``MODE`` is ``full`` (uninterrupted, a
checkpoint after every step in ``OUT/ckpt``) or the name of a checkpoint in ``OUT/ckpt`` to resume from. Each rank
writes ``OUT/{MODE}-rank{r}.json``: its parameters (as lists), its counters and the metrics it logged.
"""
import json
import os
import sys

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger

from comlrl_lightning.config import MADPOConfig, MAGRPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.trainers.preference import MADPOTrainer
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

out_dir, model_dir, family, mode = sys.argv[1:5]
torch.set_num_threads(1)


class Recorder(Logger):
    """Every ``log_metrics`` call, in order (rank 0 only logs through Lightning; the rows are rank 0's)."""

    name, version, experiment = "recorder", 0, None

    def __init__(self):
        super().__init__()
        self.rows = []

    def log_metrics(self, metrics, step=None):
        self.rows.append([step, {k: float(v) for k, v in metrics.items() if k != "epoch"}])

    def log_hyperparams(self, *args, **kwargs):
        pass


items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music", "owls", "maps", "clouds", "tea")]
common = {"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0, "top_k": None, "agent_learning_rate": 1e-2,
          "eval_interval": 0, "eval_num_samples": 0, "num_train_epochs": 2, "seed": 3}
if family == "magrpo":
    cls, args = MAGRPOTrainer, MAGRPOConfig(num_generations=2, rollout_buffer_size=2, logging_steps=1, **common)
else:
    cls, args = MADPOTrainer, MADPOConfig(preference_num_candidates=3, preference_pairs_per_sample=2,
                                          train_batch_size=2, logging_steps=1, **{**common, "max_new_tokens": 6})
logger = Recorder()
callbacks = []
if mode == "full":
    callbacks.append(ModelCheckpoint(dirpath=os.path.join(out_dir, "ckpt"), filename="{epoch}-{step}",
                                     every_n_train_steps=1, save_top_k=-1))
tr = cls(agent_model=model_dir, train_dataset=items, reward_func=cooperative_reward, formatters=FORMATTERS, args=args,
         trainer_kwargs=dict(accelerator="cpu", devices=2, strategy="ddp_find_unused_parameters_true",
                             enable_progress_bar=False, enable_model_summary=False, logger=logger,
                             enable_checkpointing=bool(callbacks), callbacks=callbacks,
                             default_root_dir=os.path.join(out_dir, mode)))
if hasattr(tr.datamodule, "shuffle"):
    tr.datamodule.shuffle = True
tr.train(ckpt_path=None if mode == "full" else os.path.join(out_dir, "ckpt", mode))
rank = tr.trainer.global_rank
with open(os.path.join(out_dir, f"{mode}-rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "world": tr.trainer.world_size, "batches": tr.trainer.num_training_batches,
               "params": [p.detach().double().flatten().tolist() for p in tr.module.parameters()],
               "global_step": tr.trainer.global_step, "env_step": tr.module.env_step,
               "updates_seen": tr.module.updates_seen, "rows": logger.rows}, f)
