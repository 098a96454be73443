"""Preference collection split across 2 CPU processes (gloo), run by tests/trainers/test_ddp.py.

Usage: ``ddp_rounds_script.py OUT MODEL KIND NUM_ITEMS`` (with ``DDP_TEST_NODES=2``: one of 2 nodes x 1
process, Lightning's multi-node path; else 2 processes on one node), KIND ``madpo`` (offline) or ``iter`` (MADPOIter, 3 rounds,
then a second fit resumed from the checkpoint of epoch 0). Each rank writes ``OUT/rank{r}.json``: what its own shard
produced (recorded around the pair builders), what the data module received (the gathered round), which files
this rank wrote, and its parameter sums.
"""
import json
import os
import sys

import comlrl_lightning.callbacks.iterative_collection as iterative_collection
import comlrl_lightning.callbacks.preference_collection as preference_collection
import comlrl_lightning.modules.madpo as madpo
import comlrl_lightning.preferences as preferences
import comlrl_lightning.replay_store as replay_store
from comlrl_lightning.config import MADPOConfig, MADPOIterConfig
from comlrl_lightning.data.iterative import IterativePreferenceDataModule
from comlrl_lightning.data.preference import PreferenceDataModule
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward

out_dir, model_dir, kind, num_items = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
record = {"local": [], "gathered": [], "writes": [], "fits": [], "logged": []}

# --- instrumentation: what this rank's shard produced, what the sink got, which files this rank wrote -----------
_offline, _iterative = preferences.collect_offline_pairs, iterative_collection.build_iterative_pairs


def offline(team, items, *a, item_offset=0, **k):
    pairs, stats = _offline(team, items, *a, item_offset=item_offset, **k)
    record["local"].append({"start": item_offset, "end": item_offset + len(items), "pairs": [p.to_json() for p in pairs]})
    return pairs, stats


def iterative(items, prompts, *a, item_offset=0, **k):
    pairs, stats = _iterative(items, prompts, *a, item_offset=item_offset, **k)
    record["local"].append({"start": item_offset, "end": item_offset + len(items), "pairs": [p.to_json() for p in pairs]})
    return pairs, stats


preferences.collect_offline_pairs, iterative_collection.build_iterative_pairs = offline, iterative
for module in (madpo, iterative_collection, preference_collection):  # what each rank would log (rank 0 does)
    def logging(trainer, metrics, step=None, _log=module.log_metrics):
        record["logged"].append({k: float(v) for k, v in metrics.items()})
        return _log(trainer, metrics, step)

    module.log_metrics = logging
_write = replay_store.write_text_atomic
replay_store.write_text_atomic = lambda path, text: (record["writes"].append(os.path.basename(path)), _write(path, text))[1]


def record_sink(cls):
    own = cls.__dict__["add_round"]

    def add_round(self, pairs):
        record["gathered"].append([p.to_json() for p in pairs])
        return own(self, pairs)

    cls.add_round = add_round


record_sink(PreferenceDataModule)
record_sink(IterativePreferenceDataModule)

items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music", "owls", "maps", "tea", "rain")]
items = items[:num_items]
common = dict(preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=8, temperature=1.0, top_p=1.0,
              top_k=None, agent_learning_rate=1e-2, train_batch_size=2, eval_interval=0, eval_num_samples=0, seed=0)
tk = dict(accelerator="cpu", devices=2, strategy="ddp", enable_progress_bar=False, enable_model_summary=False,
          default_root_dir=out_dir)
if os.environ.get("DDP_TEST_NODES") == "2":  # 2 nodes x 1 process, started by the test with the torchrun-style env
    tk.update(devices=1, num_nodes=2)


def finish(tr, label):
    sums = [float(sum(p.detach().double().sum() for p in tr.team.parameters_of(i))) for i in range(2)]
    record["fits"].append({"label": label, "sums": sums, "global_step": tr.trainer.global_step,
                           "pairs": [p.to_json() for p in tr.datamodule.pairs], "world": tr.trainer.world_size})
    return tr.trainer.global_rank


if kind == "madpo":
    from comlrl_lightning.trainers.preference import MADPOTrainer

    tr = MADPOTrainer(agent_model=model_dir, train_dataset=items, reward_func=cooperative_reward, formatters=FORMATTERS,
                      args=MADPOConfig(num_train_epochs=1, **common), trainer_kwargs=tk)
    tr.train()
    rank = finish(tr, "madpo")
    record["shards"] = tr.trainer.callbacks[[type(c).__name__ for c in tr.trainer.callbacks].index(
        "PreferenceCollection")].shards
else:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from comlrl_lightning.trainers.iterative import MADPOIterTrainer

    def build(max_epochs, callbacks=()):
        args = MADPOIterConfig(num_iterations=3, preference_replay_mode="all_history", preference_replay_sample_size=4,
                               comparator_policy="history", comparator_history_k=1, **common)
        return MADPOIterTrainer(agent_model=model_dir, train_dataset=items, eval_dataset=None,
                                reward_func=cooperative_reward, formatters=FORMATTERS, args=args, evaluation=False,
                                callbacks=callbacks, trainer_kwargs={**tk, "max_epochs": max_epochs,
                                                                     "enable_checkpointing": True})

    ckpt = ModelCheckpoint(dirpath=os.path.join(out_dir, "ckpt"), filename="round-{epoch}", every_n_epochs=1,
                           save_top_k=-1, save_on_train_epoch_end=True)
    tr = build(3, [ckpt])
    tr.train()
    rank = finish(tr, "full")
    record["shards"] = tr.collection.shards
    replay = os.path.join(out_dir, "preference_replay")

    def round_files():
        return {n: json.load(open(os.path.join(replay, n))) for n in sorted(os.listdir(replay))
                if n.startswith("iteration_")} if rank == 0 else {}

    record["round_files"] = round_files()
    tr.trainer.strategy.barrier("read round files")  # before the resumed fit rewrites round 3
    resumed = build(3)
    resumed.train(ckpt_path=os.path.join(out_dir, "ckpt", "round-epoch=0.ckpt"))
    finish(resumed, "resumed")
    record["resumed_round_files"] = round_files()

with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, **record}, f)
