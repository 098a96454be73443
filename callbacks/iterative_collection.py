"""IterativePreferenceCollection: each round, current-vs-comparator pairs over the whole train set.

Round 0 is collected in ``on_fit_start``, round t+1 in ``on_train_epoch_end`` of round t's last epoch; the
pairs go to the round data's sink ``add_round(pairs)``. The comparator is the round data's
(``datamodule.comparator_for``; see :mod:`comlrl_lightning.protocols`): any object with
``sample(prompts, num_candidates, items) -> list[Samples]``. Comparisons are scored with the round data's
``collection_oracle()``: the task reward, or MARLHFIter's learned reward once one scores comparisons.

Logs ``round/index``, ``round/num_pairs``, ``round/win_rate`` (share of the non-tied aligned comparisons the
current agents won), ``round/tie_rate`` and ``round/candidate_reward_mean`` (``torchmetrics`` metrics, global
across ranks).

Under a multi-process strategy (world size W) each rank samples the current agents and the comparator, scores
and selects pairs for its own contiguous block of the train items, with streams seeded from (seed, rank); the
blocks are gathered in rank order, so every rank adds the same global round, in dataset order, to the round
data (docs/scaling.md). The ranks' stream states (and comparator states) are gathered after every round and
saved per rank in the checkpoint; a checkpoint resumes only with the same W. ``shards`` records, per round
and rank, ``[start, end, num_pairs]``. An exception on one rank during its share of a round stops every rank
with a ``RankFailure`` naming the rank and the round, before the round is added or written.
"""

from __future__ import annotations

import random
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from comlrl_lightning.config.madpo import refuse_centralized_learner
from comlrl_lightning.data.sources import format_prompts
from comlrl_lightning.distributed import gather_round, per_rank_entry, rank_seed, shard_bounds, world
from comlrl_lightning.generation import SamplingStream
from comlrl_lightning.logging_utils import log_metrics
from comlrl_lightning.metrics import RoundMetrics
from comlrl_lightning.preferences import CollectionStats, build_iterative_pairs, sample_team
from comlrl_lightning.protocols import RoundData, TeamModule, check_protocol
from comlrl_lightning.replay import rng_from_plain, rng_state_to_plain
from comlrl_lightning.rounds import check_round_setup, next_round_at_epoch_end

_REPLAY_OPTIONS = ("preference_replay_k", "preference_replay_lambda", "preference_replay_sample_size")


def _check_replay_selection(trainer: L.Trainer, args: Any) -> None:
    """Replay options only act through the replay-selection callback: set without it, they would be ignored."""
    if any(getattr(cb, "selects_replay", False) for cb in trainer.callbacks):
        return
    mode = getattr(args, "preference_replay_mode", "current")
    given = [f"{name}={getattr(args, name)!r}" for name in _REPLAY_OPTIONS if getattr(args, name, None) is not None]
    if mode != "current" or given:
        options = ", ".join([f"preference_replay_mode={mode!r}", *given])
        raise ValueError(
            f"Replay options are set ({options}) but no ReplaySelection callback is configured, so they would be "
            "ignored. Add comlrl_lightning.callbacks.ReplaySelection after IterativePreferenceCollection in the "
            "Trainer's callbacks (or use MADPOIterTrainer / MARLHFIterTrainer), or leave the replay options unset.")


def _check_option_callbacks(trainer: L.Trainer, args: Any) -> None:
    """Options that act through a callback of their own: set without it, they would be ignored. (Callbacks do not
    import each other: the callback is recognised by its class name, subclasses included.)"""
    needs = [(f"log_reward_distribution={args.log_reward_distribution!r}", "RewardDistributionLogger")
             if getattr(args, "log_reward_distribution", False) else None,
             (f"policy_checkpoint_dir={args.policy_checkpoint_dir!r}", "HistoryCheckpoint")
             if getattr(args, "policy_checkpoint_dir", None) is not None else None]
    present = {cls.__name__ for cb in trainer.callbacks for cls in type(cb).__mro__}
    for need in needs:
        if need is not None and need[1] not in present:
            name = need[1]
            raise ValueError(
                f"{need[0]} is set but no {name} callback is configured, so it would be ignored. Add "
                f"comlrl_lightning.callbacks.{name} to the Trainer's callbacks (or use MADPOIterTrainer / "
                "MARLHFIterTrainer, which add it), or leave the option unset.")


def no_pairs_message(where: str, stats: CollectionStats) -> str:
    """Why a collection produced no pair, in words (a constant reward ties every comparison)."""
    comparisons = getattr(stats, "comparisons", 0) or stats.num_candidates
    return (f"{where}: 0 preference pairs from {stats.num_items} items ({stats.num_ties} of {comparisons} "
            f"comparisons tied, mean reward {stats.reward_mean:.4f}); nothing is trained on it. Every comparison "
            "being a tie usually means the reward gives the same value to every response (a constant or "
            "saturated reward_func/reward_processor): check it on a few completions, or sample more diverse "
            "candidates (temperature, preference_num_candidates).")


class IterativePreferenceCollection(L.Callback):
    """Collect one round of current-vs-comparator pairs at every round boundary.

    Args:
        comparator: kept for existing code; prefer the data module's ``comparator``. When given, it becomes the
            data module's comparator (a different one configured there is an error).
        seed: seed of the agents' sampling streams (agent i: ``s + 1000 * i``) and of random pair
            selection (``s``), with ``s = rank_seed(seed, rank)`` (``seed`` itself on rank 0 and in a single
            process); None = ``args.seed``.
        chunk_size: task items generated together per agent.
    """

    round_stage = 2

    def __init__(self, comparator: Any = None, seed: int | None = None, chunk_size: int = 16):
        self.comparator = comparator
        self.seed = seed
        self.chunk_size = chunk_size
        self.next_round = 0
        self.streams: list[SamplingStream] | None = None
        self.rng: random.Random | None = None
        self.history: list[dict] = []
        self.shards: list[list[list[int]]] = []
        self.rank_states: list[dict] | None = None
        self._state: dict | None = None
        self._comparator_state: dict | None = None
        self._rank, self._world = 0, 1

    @property
    def state_key(self) -> str:
        return "IterativePreferenceCollection"

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_round_setup(trainer, "IterativePreferenceCollection")
        check_protocol(pl_module, TeamModule, "IterativePreferenceCollection", "module",
                       "MADPOModule with a MADPOIterConfig")
        check_protocol(trainer.datamodule, RoundData, "IterativePreferenceCollection", "data module",
                       "IterativePreferenceDataModule")
        _check_replay_selection(trainer, pl_module.args)
        _check_option_callbacks(trainer, pl_module.args)
        refuse_centralized_learner(pl_module.args, type(self).__name__)
        trainer.datamodule.offer_comparator(self.comparator, "IterativePreferenceCollection(comparator=...)")
        self._rank, self._world = world(trainer)
        seed = rank_seed(pl_module.args.seed if self.seed is None else self.seed, self._rank)
        if self.streams is None:
            self.streams = [SamplingStream(seed + 1000 * i) for i in range(pl_module.team.num_agents)]
            self.rng = random.Random(seed)
        if self._state is not None:
            self._apply(self._state)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.next_round == 0:  # a resumed run already holds its next round's pairs
            self.collect(trainer, pl_module, 0)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        nxt = next_round_at_epoch_end(trainer, pl_module)
        if nxt is not None and nxt == self.next_round:
            self.collect(trainer, pl_module, nxt)

    def collect(self, trainer: L.Trainer, pl_module: L.LightningModule, round_index: int) -> list:
        args = pl_module.args
        dm = trainer.datamodule
        team, settings = pl_module.team, pl_module.sampling_settings()
        n = args.preference_num_candidates
        m = getattr(args, "comparator_num_candidates", None) or n
        items = list(dm.train_items)
        self.comparator = dm.comparator_for(trainer, pl_module)
        if self._comparator_state is not None:  # this rank's comparator streams from the checkpoint
            self.comparator.load_state_dict(self._comparator_state)
            self._comparator_state = None
        oracle = dm.collection_oracle()
        first, last = shard_bounds(len(items), self._rank, self._world)

        def shard() -> tuple:
            local, local_stats = [], CollectionStats()
            for start in range(first, last, self.chunk_size):
                chunk = items[start:min(start + self.chunk_size, last)]
                prompts = format_prompts(chunk, dm.formatters, offset=start)
                current = sample_team(team, prompts, n, settings, self.streams)
                comp = self.comparator.sample(prompts, m, chunk)
                new, stats = build_iterative_pairs(chunk, prompts, current, comp, oracle.score, args.pair_selection,
                                                   args.preference_pairs_per_sample, self.rng, item_offset=start)
                local.extend(new)
                local_stats.add(stats)
            return first, last, local, local_stats, self._own_state()

        # every rank takes part, empty shards too; rank order = dataset order; a rank's failure stops every rank
        shards = gather_round(shard, self._rank, self._world, f"{type(self).__name__} round {round_index}")
        round_metrics = RoundMetrics(pl_module.device)
        round_metrics.update(shards[self._rank][3])
        pairs, total = [p for shard in shards for p in shard[2]], CollectionStats()
        for shard in shards:
            total.add(shard[3])
        self.rank_states = [shard[4] for shard in shards]
        self.shards.append([[s, e, len(ps)] for s, e, ps, *_ in shards])
        self.next_round = round_index + 1
        dm.add_round(pairs)
        dm.record_candidate_rewards(round_index, total.target_raw_rewards, total.comparator_raw_rewards)
        metrics = {"round/index": round_index, **round_metrics.compute(iterative=True)}
        self.history.append(metrics)
        # CoMLRL's names of the same numbers, so existing dashboards keep working (docs/coming-from-comlrl.md)
        log_metrics(trainer, {**metrics, "iter/current_iteration": round_index + 1,
                              "iter/current_preference_pairs": total.num_pairs})
        rank_zero_info(f"Round {round_index}: {total.num_pairs} pairs from {total.num_items} items; win rate "
                       f"{metrics['round/win_rate']:.3f}, tie rate {metrics['round/tie_rate']:.3f}, mean reward "
                       f"{total.reward_mean:.4f}.")
        if not pairs:
            rank_zero_warn(no_pairs_message(f"Round {round_index}", total))
        return pairs

    def _own_state(self) -> dict:
        """This rank's streams, pair-selection RNG and comparator state (plain types)."""
        comparator = self.comparator.state_dict() if hasattr(self.comparator, "state_dict") else None
        return {"streams": [s.generator.get_state().tolist() for s in self.streams or []],
                "rng": rng_state_to_plain(self.rng) if self.rng is not None else None,
                "comparator": comparator}

    def state_dict(self) -> dict:
        # every rank's state as gathered after the last round (the streams only move while collecting), so the
        # checkpoint, which rank 0 writes, holds each rank's own; "streams"/"rng" are rank 0's (older readers)
        ranks = self.rank_states if self.rank_states is not None else [self._own_state()]
        return {
            "next_round": self.next_round,
            "streams": ranks[0]["streams"],
            "rng": ranks[0]["rng"],
            "rank_states": [{k: v for k, v in r.items() if k != "comparator" or self._world > 1} for r in ranks],
            "history": [dict(h) for h in self.history],
            "shards": [[list(s) for s in r] for r in self.shards],
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self._state = state_dict
        self.next_round = int(state_dict.get("next_round", 0))
        if self.streams is not None:
            self._apply(state_dict)

    def _apply(self, state: dict) -> None:
        import torch

        ranks = state.get("rank_states") or [{"streams": state.get("streams", []), "rng": state.get("rng")}]
        own = per_rank_entry(ranks, self._rank, self._world, "IterativePreferenceCollection")
        for s, st in zip(self.streams, own.get("streams", [])):
            s.generator.set_state(torch.tensor(st, dtype=torch.uint8))
        if own.get("rng") is not None:
            self.rng = rng_from_plain(own["rng"])
        self._comparator_state = own.get("comparator")  # applied once the round data hands out the comparator
        self.rank_states = [dict(r) for r in ranks]
        self.history = [dict(h) for h in state.get("history", [])]
        self.shards = [[list(s) for s in r] for r in state.get("shards", [])]
        self._state = None


class ScoredPreferenceCollection(IterativePreferenceCollection):
    """The collection of MARLHFIter. Kept as its own name for existing configs: every collection now scores
    with the round data's ``collection_oracle()`` (the learned reward once
    ``preference_scoring_reward="reward_model"`` has a fitted model, else the task reward)."""
