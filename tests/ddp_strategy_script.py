"""strategy="ddp" as users type it, on 2 CPU processes (gloo), run by tests/components/test_strategies.py.

Usage: ``ddp_strategy_script.py OUT MODEL FIT [FIT ...]``, FIT among ``magrpo``, ``iac``, ``maac``, ``madpo``. Each FIT
is trained twice in the same two processes, from the same seed: with ``strategy="ddp"`` (the modules average each
agent's gradients at its own step, docs/scaling.md "Strategies"), then as the reference, with DDP's own gradient
hooks doing the reduction (``ddp_find_unused_parameters_true``, the modules' own averaging switched off). Each rank
writes ``OUT/rank{r}.pt``: per fit and run, every trained parameter (agents, then critics) flattened in float64, the
global step and the world size.
"""
import os
import sys

import torch

from comlrl_lightning.config import IACConfig, MAACConfig, MADPOConfig, MAGRPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.modules.base import TeamModuleBase
from comlrl_lightning.multiturn.transitions import plain_transition

out_dir, model_dir, names = sys.argv[1], sys.argv[2], sys.argv[3:]
items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]
sampling = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2, num_train_epochs=1,
                eval_interval=0, eval_num_samples=0, seed=0)
common = dict(agent_model=model_dir, train_dataset=items, reward_func=cooperative_reward, formatters=FORMATTERS)


def build(name: str, strategy: str):
    tk = dict(accelerator="cpu", devices=2, strategy=strategy, enable_progress_bar=False, enable_model_summary=False,
              enable_checkpointing=False, default_root_dir=out_dir)
    if name == "magrpo":  # 2 turns, 2 agents: each agent's backward touches its own model only
        from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

        args = MAGRPOConfig(num_turns=2, num_generations=2, train_batch_size=2, rollout_buffer_size=2, **sampling)
        return MAGRPOTrainer(args=args, external_transition=plain_transition, trainer_kwargs=tk, **common)
    if name in ("iac", "maac"):  # separate critics (IAC) and one shared critic (MAAC), their own optimizers
        from comlrl_lightning.trainers.actor_critic import IACTrainer, MAACTrainer

        config, trainer = (IACConfig, IACTrainer) if name == "iac" else (MAACConfig, MAACTrainer)
        args = config(num_generations=2, rollout_buffer_size=2, train_batch_size=2, critic_learning_rate=1e-2,
                      **sampling)
        return trainer(args=args, trainer_kwargs=tk, **common)
    if name == "madpo":  # gradient clipping (on the averaged gradients) and accumulation over 2 batches
        from comlrl_lightning.trainers.preference import MADPOTrainer

        args = MADPOConfig(preference_num_candidates=4, preference_pairs_per_sample=2, train_batch_size=1,
                           gradient_clip_val=0.05, gradient_accumulation_steps=2,
                           **{**sampling, "max_new_tokens": 6})
        return MADPOTrainer(args=args, trainer_kwargs=tk, **common)
    raise ValueError(f"unknown fit {name!r}")


record, rank = {}, 0
own = TeamModuleBase.averages_own_gradients
for name in names:
    for run, strategy in (("ddp", "ddp"), ("reference", "ddp_find_unused_parameters_true")):
        TeamModuleBase.averages_own_gradients = own if run == "ddp" else (lambda self: False)
        torch.manual_seed(0)  # the critics' value heads are initialized from the global generator
        tr = build(name, strategy)
        tr.train()
        rank, m = tr.trainer.global_rank, tr.module
        critics = [*getattr(m, "critics", []), *getattr(m, "value_heads", [])]
        weights = [torch.cat([p.detach().double().reshape(-1) for p in tr.team.parameters_of(i)]) for i in range(2)]
        weights += [torch.cat([p.detach().double().reshape(-1) for p in c.parameters()]) for c in critics]
        record[f"{name}/{run}"] = {"weights": weights, "global_step": tr.trainer.global_step,
                                   "world": tr.trainer.world_size}
TeamModuleBase.averages_own_gradients = own
torch.save(record, os.path.join(out_dir, f"rank{rank}.pt"))
