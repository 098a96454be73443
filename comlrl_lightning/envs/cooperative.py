"""Built-in two-agent cooperative task: a short answer and a longer elaboration.

Agent 1 writes a short answer to a topic, agent 2 an elaboration. The joint reward (modelled on CoMLRL's
length-ratio examples) is

    reward = ratio_score + 0.5 * novelty

* ratio r = len(c2) / len(c1) in characters (stripped); ratio_score = 1 when 2 <= r <= 3, otherwise
  exp(-d) with d the distance from r to [2, 3]; 0 when the short answer is empty.
* novelty = 1 - |W1 ∩ W2| / |W1 ∪ W2| over the lowercased word sets of the two texts (0 when both are
  empty): repeating the partner's words lowers it, so only the pair together can raise it.

The reward lies in [0, 1.5] (``reward_range`` is declared). Items are shipped as a JSONL file with fields
``id``, ``topic``, ``prompt`` and loaded with ``datasets``.
"""

from __future__ import annotations

import math
from pathlib import Path

from comlrl_lightning.rewards import set_reward_range

DATA_FILE = Path(__file__).parent / "data" / "cooperative_length.jsonl"


def load_cooperative_dataset(split: str = "train", eval_size: int = 8, data_file: str | None = None):
    """Load the built-in task with ``datasets``; ``split`` is "train" (all but the last ``eval_size``
    items), "eval" (the last ``eval_size``) or "all"."""
    from datasets import load_dataset

    ds = load_dataset("json", data_files=str(data_file or DATA_FILE), split="train")
    n = len(ds)
    if split == "all":
        return ds
    if split == "train":
        return ds.select(range(0, n - eval_size))
    if split == "eval":
        return ds.select(range(n - eval_size, n))
    raise ValueError(f"split must be one of: train, eval, all. Got {split!r}.")


def short_answer_formatter(item: dict) -> str:
    """Prompt of agent 1 (the short answer)."""
    return f"{item['prompt']} Give a short answer.\nAnswer:"


def elaboration_formatter(item: dict) -> str:
    """Prompt of agent 2 (the longer elaboration)."""
    return f"{item['prompt']} Elaborate with new words.\nElaboration:"


FORMATTERS = [short_answer_formatter, elaboration_formatter]


def ratio_score(short: str, long: str, low: float = 2.0, high: float = 3.0) -> float:
    """1 inside [low, high] for len(long)/len(short), exp(-distance) outside, 0 for an empty short text."""
    a, b = len(short.strip()), len(long.strip())
    if a == 0:
        return 0.0
    r = b / a
    d = low - r if r < low else (r - high if r > high else 0.0)
    return math.exp(-d)


def novelty(short: str, long: str) -> float:
    """1 - Jaccard overlap of the two texts' lowercased word sets (0 when both are empty)."""
    w1, w2 = set(short.lower().split()), set(long.lower().split())
    union = w1 | w2
    if not union:
        return 0.0
    return 1.0 - len(w1 & w2) / len(union)


def cooperative_reward(completions1: list[str], completions2: list[str]) -> list[float]:
    """Joint reward per aligned pair of completions (see the module docstring)."""
    if len(completions1) != len(completions2):
        raise ValueError("the two agents' completion lists must have the same length")
    return [ratio_score(a, b) + 0.5 * novelty(a, b) for a, b in zip(completions1, completions2)]


set_reward_range(cooperative_reward, 0.0, 1.5)
