"""Offline MADPO with DDP on 2 CPU processes (gloo); each rank writes its parameter checksums (run by test_ddp.py)."""
import json
import os
import sys

from comlrl_lightning.config import MADPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.trainers.preference import MADPOTrainer

out_dir, model_dir = sys.argv[1], sys.argv[2]
items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music", "owls", "maps", "tea", "rain")]
args = MADPOConfig(num_train_epochs=1, preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=8,
                   temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2, train_batch_size=2,
                   eval_interval=0, eval_num_samples=0, seed=0)
tr = MADPOTrainer(agent_model=model_dir, train_dataset=items, reward_func=cooperative_reward, formatters=FORMATTERS,
                  args=args, trainer_kwargs=dict(accelerator="cpu", devices=2, strategy="ddp", enable_progress_bar=False,
                                                 enable_model_summary=False))
tr.train()
rank = tr.trainer.global_rank
sums = [float(sum(p.detach().double().sum() for p in tr.team.parameters_of(i))) for i in range(2)]
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "sums": sums, "global_step": tr.trainer.global_step,
               "pairs": len(tr.datamodule.pairs), "world": tr.trainer.world_size}, f)
