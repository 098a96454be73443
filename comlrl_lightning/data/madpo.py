"""MADPO's data modules: task items, the task-reward oracle, and the (round-refreshed) preference pairs.

:class:`PreferenceDataModule`: callbacks push pairs in through :meth:`PreferenceDataModule.add_round` (the "pair
sink" protocol); the train dataloader serves them as per-agent scoring batches (winner rows then loser rows).

:class:`IterativePreferenceDataModule`: round-refreshed pairs backed by the on-disk replay buffer (docs/preference.md
§3.7, §4).

It is the round data of :mod:`comlrl_lightning.protocols` (``RoundData``): it owns the run's comparator
(``comparator``; None = the source built from the module's ``args.comparator_policy`` when the first round
callback asks for it), and the pairs. The pair sink ``add_round(pairs)`` receives each round's new
current-vs-comparator pairs. Without a replay
step they become the round's training pairs (mode ``current``). :meth:`commit_round` (called by the
ReplaySelection callback) writes ``iteration_{I:04d}.json`` (I = round + 1) through a
:class:`~comlrl_lightning.replay_store.ReplayStore` and replaces the training pairs with the replay selection.

``state_dict`` holds the store's shard index and RNG, the comparator's state and the current selection (texts
only; pairs are re-tokenized), so a run resumed from a round-boundary checkpoint trains on exactly the same pairs.
A round without training pairs serves one placeholder batch ``{"empty_round": True}`` that
:class:`~comlrl_lightning.modules.MADPOModule` skips: an empty dataloader would end ``Trainer.fit``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from comlrl_lightning.data.sources import EvalDataloaders, IndexedList, load_task_setup, resolve_callable
from comlrl_lightning.data.task import EpochPermutation, ResumableLoader, trainer_epoch
from comlrl_lightning.distributed import broadcast_object, world
from comlrl_lightning.generation import context_limit, truncate_prompt_ids
from comlrl_lightning.logprobs import build_scoring_batch
from comlrl_lightning.preferences import PreferencePair
from comlrl_lightning.protocols import Comparator, check_protocol
from comlrl_lightning.replay_store import ReplayStore


def pair_loader(pairs: Sequence[PreferencePair], batch_size: int, seed: int, trainer: Any,
                collate: Callable) -> DataLoader:
    """Pairs as ``batch_size`` batches in a permutation of ``(seed, epoch)`` (``seed * 100_003 + epoch``, the epoch at
    iteration time, however often the loader is built: :class:`~comlrl_lightning.data.task.EpochPermutation`);
    the loader resumes mid-epoch (:class:`~comlrl_lightning.data.task.ResumableLoader`)."""
    epoch_of = trainer_epoch(trainer)
    sampler = EpochPermutation(len(pairs), int(seed) * 100_003, epoch_of)
    # a private generator keeps DataLoader's worker-seed draw off the global torch RNG
    return ResumableLoader(_PairList(list(pairs)), batch_size=batch_size, sampler=sampler, collate_fn=collate,
                           num_workers=0, generator=torch.Generator().manual_seed(0), kind="pair", epoch_of=epoch_of)


def check_pairs(pairs: Sequence[PreferencePair], num_agents: int) -> None:
    """Pairs must hold one text per agent on each side, and not be empty on both sides for every agent
    (such a pair carries no preference). The error names the pair index."""
    for i, p in enumerate(pairs):
        for name in ("prompts", "winner_completions", "loser_completions"):
            if len(getattr(p, name)) != num_agents:
                raise ValueError(f"Preference pair {i}: {name} has {len(getattr(p, name))} entries; "
                                 f"expected one per agent ({num_agents}).")
        if not any(t.strip() for t in p.winner_completions + p.loser_completions):
            raise ValueError(f"Preference pair {i}: every winner and loser completion is an empty string; "
                             "such a pair carries no preference. Remove it from the pair set.")


_PairList = IndexedList  # pairs served as (index, pair)
_resolve_callable = resolve_callable  # kept for importers


class PreferenceDataModule(EvalDataloaders, L.LightningDataModule):
    """Task items + oracle + preference pairs.

    Args:
        train_dataset: task items for collection (see :func:`~comlrl_lightning.data.sources.load_task_items`).
        eval_dataset: task items for evaluation (None = no evaluation).
        reward_func: the task reward (callable or dotted path); default: the built-in cooperative reward.
        reward_processor: optional float → float applied to every raw reward.
        formatters: None, one callable, or one per agent (callables or dotted paths).
        num_agents: number of agents (checked against the module's team in ``setup``).
        batch_size: pairs per optimizer step (None = the module's ``args.train_batch_size``).
        seed: seed of the per-epoch shuffles (epoch e shuffles with ``seed + e``).
        score_last_token: also score each completion's last token (centralized collaboration scores the full
            joint completion; decentralized scoring drops it, docs/decisions.md, decision 3).
    """

    def __init__(
        self,
        train_dataset: Any = "builtin:cooperative",
        eval_dataset: Any = "builtin:cooperative_eval",
        reward_func: Callable | str | None = "comlrl_lightning.envs.cooperative.cooperative_reward",
        reward_processor: Callable | str | None = None,
        formatters: Any = "comlrl_lightning.envs.cooperative.FORMATTERS",
        num_agents: int = 2,
        prompt_field: str = "prompt",
        batch_size: int | None = None,
        seed: int = 0,
        score_last_token: bool = False,
    ):
        super().__init__()
        self.oracle, self.formatters, self.train_items, self.eval_items = load_task_setup(
            train_dataset, eval_dataset, reward_func, reward_processor, formatters, num_agents, prompt_field)
        self.num_agents = num_agents
        self.prompt_field = prompt_field
        if not self.train_items:
            raise ValueError("train_dataset is empty: there is nothing to collect preferences on.")
        self.batch_size = batch_size
        self.seed = seed
        self.score_last_token = score_last_token
        self.pairs: list[PreferencePair] = []
        self.tokenizers: list[Any] | None = None

    # --- the pair sink ------------------------------------------------------------------------------
    def add_round(self, pairs: Sequence[PreferencePair]) -> None:
        """Replace the training pairs with this round's selection (offline MADPO: the single round)."""
        check_pairs(pairs, self.num_agents)
        self.pairs = list(pairs)

    # --- Lightning ----------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        module = self.trainer.lightning_module if self.trainer is not None else None
        team = getattr(module, "team", None)
        if team is not None:
            if team.num_agents != self.num_agents:
                raise ValueError(
                    f"The data module was built for num_agents={self.num_agents} but the module has "
                    f"{team.num_agents} agents."
                )
            self.tokenizers = team.tokenizers
        if self.batch_size is None:
            args = getattr(module, "args", None)
            self.batch_size = getattr(args, "train_batch_size", None) or 2

    def train_dataloader(self) -> DataLoader:
        return pair_loader(self.pairs, self.batch_size, self.seed, self.trainer, self.collate)

    def state_dict(self) -> dict[str, Any]:
        return {"pairs": [dict(p.to_json(), _ids=[p.prompt_token_ids, p.winner_token_ids, p.loser_token_ids])
                          for p in self.pairs]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pairs = []
        for rec in state.get("pairs", []):
            p = PreferencePair.from_json(rec, self.num_agents)
            ids = rec.get("_ids")
            if ids is not None:
                p.prompt_token_ids, p.winner_token_ids, p.loser_token_ids = ids
            pairs.append(p)
        self.pairs = pairs

    # --- tokenization ----------------------------------------------------------------------------------
    def pair_token_ids(self, pair: PreferencePair, agent: int) -> tuple[list[int], list[int], list[int]]:
        """(prompt, winner, loser) ids of one agent: the generated ids when kept, else re-tokenized text
        (prompt with special tokens, completions without; docs/preference.md §7.3)."""
        if pair.winner_token_ids is not None and pair.prompt_token_ids is not None:
            return pair.prompt_token_ids[agent], pair.winner_token_ids[agent], pair.loser_token_ids[agent]
        tok = self.tokenizers[agent]
        prompt = tok(pair.prompts[agent], add_special_tokens=True)["input_ids"]
        win = tok(pair.winner_completions[agent], add_special_tokens=False)["input_ids"]
        lose = tok(pair.loser_completions[agent], add_special_tokens=False)["input_ids"]
        # a prompt longer than the tokenizer's limit is cut like at sampling time (generation.truncate_prompt_ids)
        limit = context_limit(None, tok)
        if limit is not None:
            prompt = truncate_prompt_ids(prompt, max(1, limit - max(len(win), len(lose))), f"Prompt of agent {agent}",
                                         tok.bos_token_id)
        return prompt, win, lose

    def collate(self, batch: list[tuple[int, PreferencePair]]) -> dict[str, Any]:
        """Per agent one scoring batch of 2B rows (winners 0..B-1, losers B..2B-1)."""
        if self.tokenizers is None:
            raise RuntimeError("PreferenceDataModule.setup must run (inside a Trainer) before batches are built.")
        indices = [i for i, _ in batch]
        pairs = [p for _, p in batch]
        agents = []
        for a in range(self.num_agents):
            ids = [self.pair_token_ids(p, a) for p in pairs]  # (prompt, winner, loser), tokenized once
            prompts = [pr for pr, _, _ in ids] * 2
            comps = [w for _, w, _ in ids] + [lo for _, _, lo in ids]
            agents.append(build_scoring_batch(prompts, comps, self.tokenizers[a].pad_token_id,
                                              drop_last=not self.score_last_token,
                                              eos_id=self.tokenizers[a].eos_token_id))
        return {
            "agents": agents,
            "pair_index": torch.tensor(indices, dtype=torch.long),
            "candidate_reward_mean": torch.tensor([p.candidate_reward_mean for p in pairs], dtype=torch.float32),
            "winner_reward": torch.tensor([p.winner_reward for p in pairs], dtype=torch.float32),
            "loser_reward": torch.tensor([p.loser_reward for p in pairs], dtype=torch.float32),
        }


class IterativePreferenceDataModule(PreferenceDataModule):
    """:class:`PreferenceDataModule` plus the replay buffer of the iterative trainers.

    Args:
        replay_dir: folder of the round files (None: the module's ``args.preference_replay_dir``, else
            ``<trainer.default_root_dir>/preference_replay``). Files of an earlier run in that folder are not
            imported unless the run resumes from a checkpoint.
        comparator: the run's comparator (any object with ``sample(prompts_per_agent, num_candidates, items)``,
            e.g. :class:`~comlrl_lightning.comparators.local.HistoryComparator`); None = built from the
            module's ``args`` (``comparator_policy`` and friends). Every round callback uses this one object.
        **kwargs: as :class:`PreferenceDataModule`.
    """

    def __init__(self, *args: Any, replay_dir: str | None = None, comparator: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.replay_dir = replay_dir
        self.comparator = comparator
        self._comparator_owner = "the data module's `comparator` argument" if comparator is not None else None
        self._comparator_ready = False
        self._comparator_state: dict | None = None
        self.preference_oracle: Any = None
        self.candidate_raw_rewards: dict | None = None
        self.store: ReplayStore | None = None
        self.new_pairs: list[PreferencePair] = []
        self.pending_round: int | None = None
        self.rounds_added = 0
        self._pending_state: dict | None = None

    # --- the comparator ------------------------------------------------------------------------------
    def offer_comparator(self, comparator: Any, who: str) -> None:
        """Register a comparator given elsewhere (e.g. to a callback). A run has one comparator: a second,
        different object is an error naming both places."""
        if comparator is None or comparator is self.comparator:
            return
        if self.comparator is not None:
            raise ValueError(
                f"Two different comparators were configured: one through {self._comparator_owner}, one through "
                f"{who}. A run has one comparator, shared by every round callback: give it once, as the data "
                "module's `comparator` (YAML: data.init_args.comparator).")
        self.comparator, self._comparator_owner = comparator, who

    def comparator_for(self, trainer: Any, pl_module: Any) -> Any:
        """The run's comparator, built from ``pl_module.args`` if none was given, set up once per fit."""
        if self.comparator is None:
            from comlrl_lightning.comparators.local import build_comparator

            self.comparator = build_comparator(pl_module.args, model_config=getattr(pl_module, "model_config", None))
            self._comparator_owner = "the module's args (comparator_policy)"
        if not self._comparator_ready:
            check_protocol(self.comparator, Comparator, "The round data", "comparator", "HistoryComparator()")
            if hasattr(self.comparator, "setup"):
                self.comparator.setup(trainer, pl_module)
            if self._comparator_state is not None and hasattr(self.comparator, "load_state_dict"):
                self.comparator.load_state_dict(self._comparator_state)
            self._comparator_state = None
            self._comparator_ready = True
        return self.comparator

    def collection_oracle(self) -> Any:
        """The oracle that scores a round's comparisons: ``preference_oracle`` when set, else the task reward."""
        return self.preference_oracle if self.preference_oracle is not None else self.oracle

    def use_preference_oracle(self, oracle: Any) -> None:
        """Score the next rounds' comparisons with ``oracle`` (None = the task reward again)."""
        self.preference_oracle = oracle

    # --- the pair sink --------------------------------------------------------------------------------
    def add_round(self, pairs: Sequence[PreferencePair]) -> None:
        """This round's new pairs; they are also the training pairs until :meth:`commit_round` replaces them."""
        check_pairs(pairs, self.num_agents)
        self.new_pairs = list(pairs)
        self.pairs = list(pairs)
        self.pending_round = self.rounds_added
        self.rounds_added += 1

    def record_candidate_rewards(self, round_index: int, target: Sequence[float], comparator: Sequence[float]) -> None:
        """Raw rewards of every current ("target") and comparator candidate of a round (for distributions)."""
        self.candidate_raw_rewards = {"round": int(round_index), "target": list(target),
                                      "comparator": list(comparator)}

    def commit_round(self, mode: str, sample_size: int | None = None, k: int | None = None,
                     lam: float | None = None) -> dict[str, int]:
        """Write the pending round's file and select its training pairs (docs/preference.md §4.1). Returns counts."""
        if self.pending_round is None:
            raise RuntimeError("commit_round called without a pending round: call add_round(pairs) first.")
        store = self._require_store()
        iteration = self.pending_round + 1
        records = [p.to_json() for p in self.new_pairs]
        # the round holds the gathered pairs of every rank: rank 0 alone writes the file and draws the replay
        # selection, which it hands to the other ranks (they keep the same shard index; docs/scaling.md)
        rank, world_size = world(self.trainer)
        if rank == 0:
            store.write_round(iteration, records)
        else:
            store.register_round(iteration, records)
        if mode == "current":
            self.pairs = list(self.new_pairs)
        else:
            chosen = store.select(mode, records, sample_size=sample_size, k=k, lam=lam) if rank == 0 else None
            chosen = broadcast_object(chosen, world_size)
            self.pairs = [PreferencePair.from_json(r, self.num_agents) for r in chosen]
        self.pending_round = None
        return {"iteration": iteration, "num_pairs": len(records), "total_pairs": store.total_pairs,
                "replay_size": len(self.pairs), "num_shards": len(store.shards)}

    def _require_store(self) -> ReplayStore:
        if self.store is None:
            raise RuntimeError("IterativePreferenceDataModule.setup must run (inside a Trainer) before the replay "
                               "buffer is used.")
        return self.store

    # --- Lightning ----------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        super().setup(stage)
        self._comparator_ready = False  # set up again in every fit
        if self.store is None and self.trainer is not None:
            from comlrl_lightning.rounds import output_dir

            args = getattr(self.trainer.lightning_module, "args", None)
            configured = self.replay_dir or getattr(args, "preference_replay_dir", None)
            self.store = ReplayStore(output_dir(self.trainer, configured, "preference_replay"),
                                     seed=int(getattr(args, "seed", self.seed)))
        if self._pending_state is not None:
            self.load_state_dict(self._pending_state)

    def train_dataloader(self) -> DataLoader:
        if not self.pairs:
            return DataLoader([{"empty_round": True}], batch_size=None)
        # the round's pairs in a (seed, epoch) permutation; the loader resumes mid-round (docs/guide.md §1.1)
        return pair_loader(self.pairs, self.batch_size, self.seed, self.trainer, self.collate)

    def state_dict(self) -> dict[str, Any]:
        return {
            "pairs": [p.to_json() for p in self.pairs],
            "new_pairs": [p.to_json() for p in self.new_pairs],
            "pending_round": self.pending_round,
            "rounds_added": self.rounds_added,
            "replay": self.store.state_dict() if self.store is not None else None,
            "comparator": (self.comparator.state_dict() if self._comparator_ready
                           and hasattr(self.comparator, "state_dict") else self._comparator_state),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("replay") is not None and self.store is None:
            self._pending_state = state  # applied in setup, once the replay folder is known
            return
        self._pending_state = None
        self.pairs = [PreferencePair.from_json(r, self.num_agents) for r in state.get("pairs", [])]
        self.new_pairs = [PreferencePair.from_json(r, self.num_agents) for r in state.get("new_pairs", [])]
        self.pending_round = state.get("pending_round")
        self.rounds_added = int(state.get("rounds_added", 0))
        self._comparator_state = state.get("comparator")
        if self._comparator_ready and self._comparator_state is not None:
            self.comparator.load_state_dict(self._comparator_state)
            self._comparator_state = None
        if state.get("replay") is not None:
            rank0 = world(self.trainer)[0] == 0  # only rank 0 reads the round files (docs/scaling.md)
            self.store.load_state_dict(state["replay"], check_files=rank0)
            for shard in self.store.shards if rank0 else ():  # fail now, naming the file, rather than rounds later
                self.store.load_shard(shard)
