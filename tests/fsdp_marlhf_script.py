"""MARLHF's learned reward model under FSDP2 (Lightning's ModelParallelStrategy) against strategy="ddp", on 2 CPU
processes (gloo), run by tests/test_fsdp_marlhf.py.

Usage: ``fsdp_marlhf_script.py OUT MODEL FIT [FIT ...]``, FIT among ``marlhf`` (offline MARLHF: pairs, a reward model,
then MAGRPO on it), ``marlhf_iac`` (the same with IAC as the RL stage) and ``marlhf_iter`` (MARLHFIter, 2 rounds on 3
items; round 1's comparisons are scored with round 0's reward model, and the collection splits the items 2 + 1, so
rank 1 scores fewer joint responses than rank 0).
Each FIT is trained with ``strategy="ddp"``, then with ``ModelParallelStrategy()``, from the same seed, in the same
two processes. Each rank writes ``OUT/rank{r}.pt``: per fit and run, both agents' parameters before and after the fit
(gathered whole, flattened, float64), the fitted reward model's backbone (whole), this rank's element count of it
and its whole count, the type name of its first parameter, every reward the learned reward gave (in call order) and
the global step.
"""
import os
import sys

import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.reward_model import LearnedRewardOracle
from comlrl_lightning.sharding import local_numel

out_dir, model_dir, names = sys.argv[1], sys.argv[2], sys.argv[3:]
items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]
sampling = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2, num_train_epochs=1,
                eval_interval=0, eval_num_samples=0, seed=0, num_generations=2, rollout_buffer_size=1,
                preference_num_candidates=4, preference_pairs_per_sample=2, reward_learning_rate=1e-3,
                reward_train_batch_size=4, reward_num_train_epochs=1)
common = dict(agent_model=model_dir, reward_func=cooperative_reward, formatters=FORMATTERS, evaluation=False)

rewards: list[float] = []
score_joint = LearnedRewardOracle.score_joint


def recorded(self, *args, **kwargs):
    out = score_joint(self, *args, **kwargs)
    rewards.extend(out)
    return out


LearnedRewardOracle.score_joint = recorded


def build(name: str, strategy):
    tk = dict(accelerator="cpu", devices=2, strategy=strategy, enable_progress_bar=False, enable_model_summary=False,
              enable_checkpointing=False, default_root_dir=out_dir, logger=False)
    if name == "marlhf":
        from comlrl_lightning.config.marlhf import MARLHFConfig
        from comlrl_lightning.trainers.marlhf import MARLHFTrainer

        return MARLHFTrainer(args=MARLHFConfig(**sampling), trainer_kwargs=tk, train_dataset=items, **common)
    if name == "marlhf_iac":  # the actor-critic RL stage (IAC, a value head per agent) scores through reward_func
        from comlrl_lightning.config.marlhf import MARLHFConfig
        from comlrl_lightning.trainers.marlhf import MARLHFTrainer

        args = MARLHFConfig(**{**sampling, "rl_algorithm": "iac", "num_generations": 1, "use_separate_critic": False,
                               "critic_learning_rate": 1e-2})
        return MARLHFTrainer(args=args, trainer_kwargs=tk, train_dataset=items, **common)
    if name == "marlhf_iter":
        from comlrl_lightning.config.marlhf import MARLHFIterConfig
        from comlrl_lightning.trainers.marlhf import MARLHFIterTrainer

        args = MARLHFIterConfig(num_iterations=2, preference_scoring_reward="reward_model", **sampling)
        return MARLHFIterTrainer(args=args, trainer_kwargs=tk, train_dataset=items[:3], **common)
    raise ValueError(f"unknown fit {name!r}")


def whole(params) -> torch.Tensor:
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().double().reshape(-1)
                      for p in params])


def agents(tr) -> list[list[torch.Tensor]]:
    return [list(tr.team.parameters_of(i)) for i in range(2)]


record, rank = {}, 0
for name in names:
    for run in ("ddp", "fsdp2"):
        torch.manual_seed(0)
        tr = build(name, "ddp" if run == "ddp" else ModelParallelStrategy())
        initial = [whole(ps) for ps in agents(tr)]
        rewards.clear()
        tr.train()
        rank, model = tr.trainer.global_rank, tr.reward_model
        backbone = list(model.backbone.parameters())
        record[f"{name}/{run}"] = {
            "initial": initial, "weights": [whole(ps) for ps in agents(tr)], "global_step": tr.trainer.global_step,
            "rm_weights": whole(backbone), "rm_local": local_numel(backbone), "rm_numel": sum(p.numel() for p in backbone),
            "rm_head_numel": sum(p.numel() for p in model.head.parameters()), "rm_type": type(backbone[0]).__name__,
            "rewards": list(rewards), "fits": tr.reward_fit.fits, "world": tr.trainer.world_size}
torch.save(record, os.path.join(out_dir, f"rank{rank}.pt"))
