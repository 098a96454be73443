"""Preference collection split across 2 CPU processes (gloo), run by tests/trainers/test_ddp.py.

Usage: ``ddp_rounds_script.py OUT MODEL KIND NUM_ITEMS`` (with ``DDP_TEST_NODES=2``: one of 2 nodes x 1
process, Lightning's multi-node path; else 2 processes on one node), KIND ``madpo`` (offline) or ``iter`` (MADPOIter, 3 rounds,
then a second fit resumed from the checkpoint of epoch 0). With ``DDP_TEST_FAIL=RANK:ROUND:MODE`` a third fit runs in
which the pair builder of rank RANK raises (MODE ``raise``) or ends the process (``exit``) in round ROUND; the
script records the error each rank caught, and resumes that fit from its checkpoint of epoch 0 (KIND ``fail``: that
fit alone). Each rank writes ``OUT/rank{r}.json``: what its own shard
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
from comlrl_lightning.data.madpo import IterativePreferenceDataModule, PreferenceDataModule
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward

out_dir, model_dir, kind, num_items = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
record = {"local": [], "gathered": [], "writes": [], "fits": [], "logged": []}

# --- instrumentation: what this rank's shard produced, what the sink got, which files this rank wrote -----------
_offline, _iterative = preferences.collect_offline_pairs, iterative_collection.build_iterative_pairs


def offline(team, items, *a, item_offset=0, **k):
    pairs, stats = _offline(team, items, *a, item_offset=item_offset, **k)
    record["local"].append({"start": item_offset, "end": item_offset + len(items), "pairs": [p.to_json() for p in pairs]})
    return pairs, stats


FAIL = os.environ.get("DDP_TEST_FAIL")  # "RANK:ROUND:MODE" (MODE raise or exit), armed for the failing fit only
armed = {"on": False, "round": None}
_collect = iterative_collection.IterativePreferenceCollection.collect


def collect(self, trainer, pl_module, round_index):
    armed["round"] = round_index
    return _collect(self, trainer, pl_module, round_index)


iterative_collection.IterativePreferenceCollection.collect = collect


def iterative(items, prompts, *a, item_offset=0, **k):
    if armed["on"] and FAIL:
        rank, at, mode = FAIL.split(":")
        import torch.distributed as dist

        if dist.get_rank() == int(rank) and armed["round"] == int(at):
            if mode == "exit":
                os._exit(3)
            raise RuntimeError(f"injected failure on rank {rank}")
    pairs, stats = _iterative(items, prompts, *a, item_offset=item_offset, **k)
    record["local"].append({"start": item_offset, "end": item_offset + len(items), "pairs": [p.to_json() for p in pairs]})
    return pairs, stats


preferences.collect_offline_pairs, iterative_collection.build_iterative_pairs = offline, iterative
for module in (iterative_collection, preference_collection):  # what each rank would log (rank 0 does)
    def logging(trainer, metrics, step=None, _log=module.log_metrics):
        record["logged"].append({k: float(v) for k, v in metrics.items()})
        return _log(trainer, metrics, step)

    module.log_metrics = logging


def training_means(*args, _mean=madpo.mean_across_ranks, **kwargs):  # what MADPO's self.log gets on each rank
    out = _mean(*args, **kwargs)
    record["logged"].append({k: float(v) for k, v in out.items()})
    return out


madpo.mean_across_ranks = training_means
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

    from comlrl_lightning.trainers.madpo import MADPOIterTrainer

    def build(max_epochs, callbacks=(), root=out_dir):
        args = MADPOIterConfig(num_iterations=3, preference_replay_mode="all_history", preference_replay_sample_size=4,
                               comparator_policy="history", comparator_history_k=1, **common)
        return MADPOIterTrainer(agent_model=model_dir, train_dataset=items, eval_dataset=None,
                                reward_func=cooperative_reward, formatters=FORMATTERS, args=args, evaluation=False,
                                callbacks=callbacks, trainer_kwargs={**tk, "max_epochs": max_epochs,
                                                                     "enable_checkpointing": True,
                                                                     "default_root_dir": root})

    def checkpoints(root):
        return ModelCheckpoint(dirpath=os.path.join(root, "ckpt"), filename="round-{epoch}", every_n_epochs=1,
                               save_top_k=-1, save_on_train_epoch_end=True)

    def round_files(root):
        replay = os.path.join(root, "preference_replay")
        return {n: json.load(open(os.path.join(replay, n))) for n in sorted(os.listdir(replay))
                if n.startswith("iteration_")} if rank == 0 else {}

    rank = None
    if kind == "iter":
        tr = build(3, [checkpoints(out_dir)])
        tr.train()
        rank = finish(tr, "full")
        record["shards"] = tr.collection.shards
        record["round_files"] = round_files(out_dir)
        tr.trainer.strategy.barrier("read round files")  # before the resumed fit rewrites round 3
        resumed = build(3)
        resumed.train(ckpt_path=os.path.join(out_dir, "ckpt", "round-epoch=0.ckpt"))
        finish(resumed, "resumed")
        record["resumed_round_files"] = round_files(out_dir)
    if FAIL:  # a fit where one rank fails in a round, then the fit resumed from its last checkpoint
        import time

        kept = {k: list(record[k]) for k in ("local", "gathered", "writes", "logged")}  # the checks above read these
        failing_root = os.path.join(out_dir, "failing")
        failing = build(3, [checkpoints(failing_root)], root=failing_root)
        armed["on"], started = True, time.time()
        try:
            failing.train()
            record["failure"] = None
        except Exception as exc:  # noqa: BLE001 - the test reads the message
            record["failure"] = f"{type(exc).__name__}: {exc}"
            print(f"rank {failing.trainer.global_rank} caught {record['failure']}", file=sys.stderr)
        armed["on"] = False
        record["failure_seconds"] = time.time() - started
        rank = failing.trainer.global_rank
        record["failed_round_files"] = round_files(failing_root)
        record["failed_checkpoints"] = sorted(os.listdir(os.path.join(failing_root, "ckpt"))) if rank == 0 else []
        again = build(3, root=failing_root)
        again.train(ckpt_path=os.path.join(failing_root, "ckpt", "round-epoch=0.ckpt"))
        finish(again, "after failure")
        record["recovered_round_files"] = round_files(failing_root)
        record.update(kept)

with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, **record}, f)
