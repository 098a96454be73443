"""MARLHF, MARLHFIter, IAC and MAAC with DDP on 2 CPU processes (gloo), one fit after the other in the same two
processes; run by tests/trainers/test_ddp.py.

Usage: ``ddp_families_script.py OUT MODEL``. Each rank writes ``OUT/rank{r}.json`` with, per fit: what its own
shard of a preference collection produced (recorded around the pair builders), the pairs each reward-model fit
received and the fitted model's parameter sum, the (item, agent, turn, reward, return) of every actor-critic
sample its own rollouts produced, the metrics it would log, and its parameter sums (actors; critics).
"""
import json
import os
import sys

import comlrl_lightning.callbacks.iterative_collection as iterative_collection
import comlrl_lightning.callbacks.reward_model as learned_reward
import comlrl_lightning.modules.actor_critic as actor_critic
import comlrl_lightning.modules.magrpo as magrpo
import comlrl_lightning.preferences as preferences
from comlrl_lightning.config import IACConfig, MAACConfig
from comlrl_lightning.config.marlhf import MARLHFConfig, MARLHFIterConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.trainers.actor_critic import IACTrainer, MAACTrainer
from comlrl_lightning.trainers.marlhf import MARLHFIterTrainer, MARLHFTrainer

out_dir, model_dir = sys.argv[1], sys.argv[2]
fits: list[dict] = []


def fit_record() -> dict:
    return fits[-1]


# --- instrumentation ---------------------------------------------------------------------------------------------
_offline, _iterative = preferences.collect_offline_pairs, iterative_collection.build_iterative_pairs


def offline(team, items, *a, item_offset=0, **k):
    pairs, stats = _offline(team, items, *a, item_offset=item_offset, **k)
    fit_record()["local"].append([item_offset, item_offset + len(items), [p.to_json() for p in pairs]])
    return pairs, stats


def iterative(items, prompts, *a, item_offset=0, **k):
    pairs, stats = _iterative(items, prompts, *a, item_offset=item_offset, **k)
    fit_record()["local"].append([item_offset, item_offset + len(items), [p.to_json() for p in pairs]])
    return pairs, stats


preferences.collect_offline_pairs, iterative_collection.build_iterative_pairs = offline, iterative
_reward_fit = learned_reward._RewardModelFitting.fit


def reward_fit(self, trainer, pl_module, pairs, seed):
    model = _reward_fit(self, trainer, pl_module, pairs, seed)
    total = None if model is None else float(sum(p.detach().double().sum() for p in model.parameters()))
    fit_record()["reward_fits"].append({"pairs": [p.to_json() for p in pairs], "sum": total})
    return model


learned_reward._RewardModelFitting.fit = reward_fit
_collect = actor_critic.ActorCriticModule.collect_batch


def collect_batch(self, entries, num_generations=None, oracle=None):
    episodes = _collect(self, entries, num_generations=num_generations, oracle=oracle)
    if self.trainer.training:
        fit_record()["samples"].extend([s.item, s.agent, s.turn, s.reward, s["return"]] for e in episodes for s in e)
    return episodes


actor_critic.ActorCriticModule.collect_batch = collect_batch
for module in (magrpo, actor_critic, iterative_collection, learned_reward):  # what each rank would log (rank 0 does)
    def logging(trainer, metrics, step=None, _log=module.log_metrics):
        fit_record()["logged"].append({k: float(v) for k, v in metrics.items()})
        return _log(trainer, metrics, step)

    module.log_metrics = logging

# --- the fits ----------------------------------------------------------------------------------------------------
items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]
sampling = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2, num_train_epochs=1,
                eval_interval=0, eval_num_samples=0, seed=0)
marlhf = dict(num_generations=2, rollout_buffer_size=1, preference_num_candidates=4, preference_pairs_per_sample=2,
              reward_learning_rate=1e-3, reward_train_batch_size=4, reward_num_train_epochs=1, **sampling)
ac = dict(num_generations=2, rollout_buffer_size=2, train_batch_size=2, critic_learning_rate=1e-2, **sampling)
common = dict(agent_model=model_dir, train_dataset=items, reward_func=cooperative_reward, formatters=FORMATTERS)
tk = dict(accelerator="cpu", devices=2, strategy="ddp_find_unused_parameters_true", enable_progress_bar=False,
          enable_model_summary=False, enable_checkpointing=False, default_root_dir=out_dir)
runs = [
    ("marlhf", lambda: MARLHFTrainer(args=MARLHFConfig(**marlhf), evaluation=False, trainer_kwargs=tk, **common)),
    ("marlhf_iter", lambda: MARLHFIterTrainer(args=MARLHFIterConfig(num_iterations=2, **marlhf), evaluation=False,
                                              trainer_kwargs=tk, **common)),
    ("iac", lambda: IACTrainer(args=IACConfig(**ac), trainer_kwargs=tk, **common)),
    ("maac", lambda: MAACTrainer(args=MAACConfig(**ac), trainer_kwargs=tk, **common)),
]
rank = 0
for name, build in runs:
    fits.append({"name": name, "local": [], "reward_fits": [], "samples": [], "logged": []})
    tr = build()
    tr.train()
    rank = tr.trainer.global_rank
    m = tr.module
    actors = [float(sum(p.detach().double().sum() for p in tr.team.parameters_of(i))) for i in range(2)]
    critics = [float(sum(p.detach().double().sum() for p in c.parameters()))
               for c in [*getattr(m, "critics", []), *getattr(m, "value_heads", [])]]
    fit_record().update(world=tr.trainer.world_size, global_step=tr.trainer.global_step, actors=actors,
                        critics=critics)

with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "fits": fits}, f)
