"""The DataModule: task items, the task-reward oracle, and the (round-refreshed) preference pairs.

Callbacks push pairs in through :meth:`PreferenceDataModule.add_round` (the "pair sink" protocol); the
train dataloader serves them as per-agent scoring batches (winner rows then loser rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from comlrl_lightning.data.tasks import EvalDataloaders, IndexedList, load_task_setup, resolve_callable
from comlrl_lightning.data.tasks_dm import EpochPermutation, ResumableLoader, trainer_epoch
from comlrl_lightning.generation import context_limit, truncate_prompt_ids
from comlrl_lightning.logprobs import build_scoring_batch
from comlrl_lightning.preferences import PreferencePair


def pair_loader(pairs: Sequence[PreferencePair], batch_size: int, seed: int, trainer: Any,
                collate: Callable) -> DataLoader:
    """Pairs as ``batch_size`` batches in a permutation of ``(seed, epoch)`` (``seed * 100_003 + epoch``, the epoch at
    iteration time, however often the loader is built: :class:`~comlrl_lightning.data.tasks_dm.EpochPermutation`);
    the loader resumes mid-epoch (:class:`~comlrl_lightning.data.tasks_dm.ResumableLoader`)."""
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
        train_dataset: task items for collection (see :func:`~comlrl_lightning.data.tasks.load_task_items`).
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
