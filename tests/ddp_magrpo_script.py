"""2-turn MAGRPO with DDP on 2 CPU processes (gloo), run by tests/trainers/test_ddp.py.

Usage: ``ddp_magrpo_script.py OUT MODEL``. Each rank writes ``OUT/rank{r}.json``: the (index, agent, turn,
group size, advantages) of every node sample its own rollouts produced, the training metrics it logged, and its
parameter sums.
"""
import json
import os
import sys

import comlrl_lightning.modules.magrpo as magrpo
from comlrl_lightning.config import MAGRPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.modules.magrpo import MAGRPOModule
from comlrl_lightning.multiturn.transitions import plain_transition
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

out_dir, model_dir = sys.argv[1], sys.argv[2]
groups = []
_rollout = MAGRPOModule.rollout_batch


def rollout_batch(self, entries, *a, **k):
    trees = _rollout(self, entries, *a, **k)
    for (index, _), (_, samples) in zip(entries, trees):
        groups.extend([index, s.agent, s.turn, len(s.completion_ids), s.advantages] for s in samples)
    return trees


MAGRPOModule.rollout_batch = rollout_batch
logged = []
_log = magrpo.log_metrics
magrpo.log_metrics = lambda trainer, metrics, step=None: (logged.append(dict(metrics)), _log(trainer, metrics, step))[1]
items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]
args = MAGRPOConfig(num_turns=2, num_generations=2, max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None,
                    agent_learning_rate=1e-2, train_batch_size=2, rollout_buffer_size=2, num_train_epochs=1,
                    eval_interval=0, eval_num_samples=0, seed=0)
tr = MAGRPOTrainer(agent_model=model_dir, train_dataset=items, reward_func=cooperative_reward, formatters=FORMATTERS,
                   external_transition=plain_transition, args=args,
                   trainer_kwargs=dict(accelerator="cpu", devices=2, strategy="ddp_find_unused_parameters_true",
                                       enable_progress_bar=False, enable_model_summary=False,
                                       default_root_dir=out_dir))
tr.train()
rank = tr.trainer.global_rank
sums = [float(sum(p.detach().double().sum() for p in tr.team.parameters_of(i))) for i in range(2)]
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "world": tr.trainer.world_size, "sums": sums, "groups": groups, "logged": logged,
               "global_step": tr.trainer.global_step}, f)
