"""RewardPairDataModule: preference pairs as joint texts for the JointRewardModel (docs/preference.md §8.1, §8.3).

A batch of B pairs is one padded tokenization of 2B joint texts: rows 0..B-1 are the winners (chosen), rows
B..2B-1 the losers (rejected), plus ``pair_index`` ``[B]`` (the pairs' positions in their split). Texts are
built with the pairs' stored prompts (:func:`~comlrl_lightning.reward_model.joint_reward_text`) and truncated
at the model's ``max_length`` (``reward_max_length``, else the tokenizer's ``model_max_length``).

Every pair is checked in ``setup``, before any step, and errors name the split and the pair index:
a side whose completions are all empty, and a ``reward_max_length`` that leaves no room for the responses
(:func:`~comlrl_lightning.reward_model.check_prompt_part_fits`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, Dataset

from comlrl_lightning.files import json_digest
from comlrl_lightning.preferences import PreferencePair
from comlrl_lightning.reward_model import (
    check_prompt_part_fits,
    encode_joint_texts,
    joint_reward_text,
    resolve_max_length,
    response_length_features,
)

BUILTIN_LENGTH_PAIRS = "builtin:length_preference"
_WORDS = ("rivers", "mountains", "forests", "deserts", "oceans", "bread", "cheese", "apples", "coffee",
          "trains", "bicycles", "rockets", "ships", "music", "poetry", "dance", "chess", "fox", "dog", "cat",
          "sun")


def length_preference_pairs(num_pairs: int = 200, num_agents: int = 2, seed: int = 0) -> list[PreferencePair]:
    """Synthetic pairs whose preference a small model can learn: the longer joint answer wins.

    Agent i's prompt is ``"Topic: <word>."``; winner completions have 6-12 random words, loser ones 1-4.
    Deterministic for a given ``seed``. Used by ``configs/reward_model/tiny.yaml`` and the tests.
    """
    rng = random.Random(seed)

    def answer(lo: int, hi: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))

    pairs = []
    for _ in range(num_pairs):
        prompts = [f"Topic: {rng.choice(_WORDS)}." for _ in range(num_agents)]
        winner = [answer(6, 12) for _ in range(num_agents)]
        loser = [answer(1, 4) for _ in range(num_agents)]
        pairs.append(PreferencePair(prompts, winner, loser, winner_reward=1.0, loser_reward=0.0,
                                    candidate_reward_mean=0.5))
    return pairs


def load_pairs(source: Any) -> list[PreferencePair]:
    """Pairs from PreferencePair objects, pair records (dicts), a file path, or ``builtin:length_preference``.

    Files: ``.jsonl`` (one record per line), or ``.json`` holding a list of records or a replay round file
    ``{"pairs": [...]}`` (docs/preference.md §3.7). The builtin name gives :func:`length_preference_pairs` ``()``.
    """
    if source is None:
        return []
    if source == BUILTIN_LENGTH_PAIRS:
        return length_preference_pairs()
    if isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"Preference pair file {str(path)!r} does not exist.")
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
            records = data["pairs"] if isinstance(data, dict) and "pairs" in data else data
            if isinstance(data, dict) and "sha256" in data and json_digest(records) != data["sha256"]:
                raise ValueError(f"Preference pair file {str(path)!r} was modified after it was written: its pairs "
                                 "do not match the file's sha256 digest.")
        if not isinstance(records, list):
            raise TypeError(f"{str(path)!r} must hold a list of pair records, or a replay file with 'pairs'.")
        source = records
    pairs = []
    for j, p in enumerate(source):
        if isinstance(p, PreferencePair):
            pairs.append(p)
        elif isinstance(p, dict):
            pairs.append(PreferencePair.from_json(p))
        else:
            raise TypeError(f"pair {j} is a {type(p).__name__}; expected a PreferencePair or a record dict.")
    return pairs


def _held_out_indices(pairs: Sequence[PreferencePair], fraction: float, seed: int) -> list[int]:
    """Indices of about ``fraction`` of the pairs (at least one, never all), held out by whole prompt sets.

    Pairs built from one prompt's candidates share completions (``reward_gap`` reuses a prompt's best
    candidate in many pairs), so a random split of pairs would put the same completion on both sides and
    measure memorisation. Prompt sets are taken in a seeded random order until ``round(n * fraction)``
    pairs are held out; when all pairs share one prompt set, single pairs are held out instead.
    """
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    k = min(max(1, round(len(pairs) * fraction)), len(pairs) - 1)
    groups: dict[tuple[str, ...], list[int]] = {}
    for i in order:
        groups.setdefault(tuple(pairs[i].prompts), []).append(i)
    held: list[int] = []
    for members in groups.values():
        if len(held) >= k:
            break
        if len(held) + len(members) < len(pairs):
            held += members
    return sorted(held) if held else sorted(order[:k])


def _padded(texts: Sequence[str], n: int) -> list[str]:
    return list(texts) + [""] * (n - len(texts))


class _Texts(Dataset):
    def __init__(self, chosen: list[str], rejected: list[str], features: list[tuple[list[float], list[float]]]):
        self.chosen, self.rejected, self.features = chosen, rejected, features

    def __len__(self) -> int:
        return len(self.chosen)

    def __getitem__(self, i: int) -> tuple[int, str, str, tuple | None]:
        return i, self.chosen[i], self.rejected[i], self.features[i] if self.features else None


class RewardPairDataModule(L.LightningDataModule):
    """Train (and optional held-out) preference pairs for :class:`~comlrl_lightning.modules.JointRewardModel`.

    Args:
        train_pairs: PreferencePairs, pair records, or a ``.jsonl``/``.json`` path (see :func:`load_pairs`).
        eval_pairs: held-out pairs in the same forms; None for no validation (or ``val_fraction``).
        val_fraction: when ``eval_pairs`` is None, hold out about this fraction of the train pairs, whole
            prompt sets at a time (seeded with ``seed``; at least one pair on each side), 0 for none.
        batch_size: pairs per step; None = the model's ``args.reward_train_batch_size``.
        eval_batch_size: pairs per validation batch; None = ``batch_size``.
        tokenizer: None = the model's tokenizer (taken in ``setup``).
        max_length: truncation length; None = the model's ``max_length`` (``reward_max_length`` resolved).
        seed: seed of the held-out split and of the shuffle order of the train pairs (epochs differ).
    """

    def __init__(
        self,
        train_pairs: Any,
        eval_pairs: Any = None,
        val_fraction: float = 0.0,
        batch_size: int | None = None,
        eval_batch_size: int | None = None,
        tokenizer: Any = None,
        max_length: int | None = None,
        seed: int = 0,
    ):
        super().__init__()
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1); got {val_fraction!r}.")
        if val_fraction and eval_pairs is not None:
            raise ValueError("Pass either eval_pairs or val_fraction, not both.")
        for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or null; got {value!r}.")
        train = load_pairs(train_pairs)
        evals = load_pairs(eval_pairs)
        if val_fraction:
            held = set(_held_out_indices(train, val_fraction, seed))
            evals = [p for i, p in enumerate(train) if i in held]
            train = [p for i, p in enumerate(train) if i not in held]
        if not train:
            raise ValueError("RewardPairDataModule needs at least one training pair; got none.")
        self.train_pairs, self.eval_pairs = train, evals
        if not evals:
            # Lightning runs validation only when val_dataloader is defined; shadowing it with None skips the
            # loop without the "length of list is zero" warning that an empty loader list would give.
            self.val_dataloader = None  # type: ignore[assignment]
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.tokenizer, self.max_length = tokenizer, max_length
        self.seed = seed
        self._datasets: dict[str, _Texts] = {}
        self._resolved_max_length: int | None = None
        self._length_agents: int | None = None  # set in setup for a length-aware reward head

    def setup(self, stage: str | None = None) -> None:
        module = getattr(self.trainer, "lightning_module", None) if self.trainer is not None else None
        if self.tokenizer is None:
            if module is None or getattr(module, "tokenizer", None) is None:
                raise RuntimeError(
                    "RewardPairDataModule needs a tokenizer: pass tokenizer= or fit with a JointRewardModel."
                )
            self.tokenizer = module.tokenizer
        if self.max_length is not None:
            self._resolved_max_length = resolve_max_length(self.tokenizer, self.max_length)
        elif module is not None and hasattr(module, "max_length"):
            self._resolved_max_length = module.max_length
        else:
            self._resolved_max_length = resolve_max_length(self.tokenizer, None)
        if getattr(module, "length_head", None) is not None:
            self._length_agents = int(module.num_agents)
        if self.batch_size is None:
            args = getattr(module, "args", None)
            self.batch_size = int(getattr(args, "reward_train_batch_size", 1))
        self._datasets = {"train": self._texts(self.train_pairs, "train")}
        if self.eval_pairs:
            self._datasets["val"] = self._texts(self.eval_pairs, "eval")

    def _texts(self, pairs: Sequence[PreferencePair], split: str) -> _Texts:
        """Joint texts of winners and losers, after checking every pair (errors name split and index)."""
        chosen, rejected, features = [], [], []
        n_long = 0
        checked: set[tuple[str, ...]] = set()
        for j, p in enumerate(pairs):
            n = max(len(p.prompts), len(p.winner_completions), len(p.loser_completions))
            for side, comps in (("winner", p.winner_completions), ("loser", p.loser_completions)):
                if not any((c or "").strip() for c in comps):
                    raise ValueError(
                        f"{split} pair {j}: every {side} completion is empty, so its joint text has no "
                        "response to score. Drop the pair or fix its completions."
                    )
            key = (str(n), *p.prompts)
            if key not in checked:
                check_prompt_part_fits(self.tokenizer, p.prompts, n, self._resolved_max_length,
                                       f"{split} pair {j}")
                checked.add(key)
            # Both sides get n agents even when a record's lists differ in length (missing texts are "").
            chosen.append(joint_reward_text(p.prompts, _padded(p.winner_completions, n)))
            rejected.append(joint_reward_text(p.prompts, _padded(p.loser_completions, n)))
            if self._length_agents is not None:
                if n > self._length_agents:
                    raise ValueError(f"{split} pair {j} has {n} agents; the length-aware reward model was built "
                                     f"for num_agents={self._length_agents}.")
                features.append((response_length_features(p.winner_completions, self._length_agents),
                                 response_length_features(p.loser_completions, self._length_agents)))
        if self._resolved_max_length is not None:
            lengths = [len(ids) for ids in self.tokenizer(chosen + rejected)["input_ids"]]
            n_long = sum(n > self._resolved_max_length for n in lengths)
        if n_long:
            rank_zero_warn(
                f"{n_long} of {2 * len(pairs)} {split} joint texts are longer than reward_max_length="
                f"{self._resolved_max_length} tokens and are truncated."
            )
        return _Texts(chosen, rejected, features)

    def collate(self, batch: list[tuple]) -> dict[str, torch.Tensor]:
        """``input_ids``, ``attention_mask`` ``[2B, T]`` (chosen rows, then rejected); ``pair_index`` ``[B]``;
        for a length-aware reward head also ``length_features`` ``[2B, F]`` (F numbers per joint text, see
        :func:`~comlrl_lightning.reward_model.response_length_features`).

        One tokenizer call over the 2B texts, so both sides share the padding width; scores do not depend
        on it (last-token pooling, position ids from the mask)."""
        texts = [b[1] for b in batch] + [b[2] for b in batch]
        enc = encode_joint_texts(self.tokenizer, texts, self._resolved_max_length)
        enc["pair_index"] = torch.tensor([b[0] for b in batch], dtype=torch.long)
        if batch and batch[0][3] is not None:
            enc["length_features"] = torch.tensor([b[3][0] for b in batch] + [b[3][1] for b in batch])
        return enc

    def train_dataloader(self) -> DataLoader:
        gen = torch.Generator().manual_seed(self.seed)
        return DataLoader(self._datasets["train"], batch_size=self.batch_size, shuffle=True, generator=gen,
                          collate_fn=self.collate)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self._datasets["val"], batch_size=self.eval_batch_size or self.batch_size,
                          shuffle=False, collate_fn=self.collate)
