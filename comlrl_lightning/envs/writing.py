"""Cooperative writing with real text: one agent summarises a passage, the other elaborates on it.

The items (``data/writing_passages.jsonl``: ``id``, ``topic``, ``passage``, ``prompt`` = the passage) are 56
short encyclopaedic passages of three sentences, written for this library. The reward follows the level structure
of CoMLRL's writing tasks (the TLDR summary/elaboration reward of its writing repository), scaled to the short
completions a CPU run affords; each level is reached only when the one before it scored:

1. **Token limits** (``level_words``): 0.5 when both texts have ``min_words <= w <= max_words`` whitespace words,
   else 0 and the reward stops.
2. **Length ratio** (``level_ratio``): r = len(c2) / len(c1) in characters (stripped); 1 for
   ``1.6 <= r <= 3.2``, (r - 1.1) / 0.5 for 1.1 <= r < 1.6, (5 - r) / 1.8 for 3.2 < r <= 5, else 0 (stop).
3. **Vocabulary diversity** (``level_vocabulary``): u = |unique words of c2| / |unique words of c1| (all words,
   lowercased); 0.5 for u >= 2, 0.5 * (u - 1.3) / 0.7 for 1.3 <= u < 2, else 0 (stop).
4. **Style** (``level_style``): 0.4 * t + 0.6 * min(J, 0.03) / 0.03, where t = 0 without a transition phrase in c2
   and min(1, 0.4 + 0.1 * (k - 1)) with k distinct ones (``TRANSITIONS``), and J is the Jaccard similarity of the
   two texts' content-word sets (``STOPWORDS`` removed): sharing a few content words keeps the parts on one topic.

``writing_reward`` = the sum, in [0, 3] (``reward_range`` is declared). The functions are pure and take strings.
"""

from __future__ import annotations

import re
from pathlib import Path

from comlrl_lightning.rewards import set_reward_range

DATA_FILE = Path(__file__).parent / "data" / "writing_passages.jsonl"
NUM_EVAL = 16  # the last 16 items are held out

STOPWORDS = frozenset("""
a about after all also an and any are as at be been being both but by can could did do does each for from had has
have he her here him his how i if in into is it its just may me might more most much must my no not now of on one
only or other our out own same she should so some such than that the their them then there these they this those
to too up us very was we were what when where which who why will with would you your
""".split())

TRANSITIONS = (
    "additionally", "also", "as a result", "because", "besides", "consequently", "especially", "for example",
    "for instance", "furthermore", "however", "in addition", "in fact", "in other words", "in particular",
    "including", "indeed", "instead", "meanwhile", "moreover", "namely", "nevertheless", "similarly", "such as",
    "therefore", "thus", "while", "whereas", "although", "finally", "overall", "in short",
)

_WORD = re.compile(r"\b\w+\b")


def load_writing_items(split: str = "train", data_file: str | None = None) -> list[dict]:
    """The shipped items: "train" (all but the last ``NUM_EVAL``), "eval" (the last ``NUM_EVAL``) or "all"."""
    import json

    rows = [json.loads(line) for line in Path(data_file or DATA_FILE).read_text().splitlines() if line.strip()]
    if split == "all":
        return rows
    if split == "train":
        return rows[:-NUM_EVAL]
    if split == "eval":
        return rows[-NUM_EVAL:]
    raise ValueError(f"split must be one of: train, eval, all. Got {split!r}.")


def summary_formatter(item: dict) -> str:
    """Plain-text prompt of agent 1 (the short summary); wrap it in a chat template for an instruct model."""
    return f"Summarise this text in one short sentence.\n\nText: {item['passage']}"


def elaboration_formatter(item: dict) -> str:
    """Plain-text prompt of agent 2 (the longer elaboration)."""
    return ("Explain this text in more detail, with new words and an example. Another writer gives the short "
            f"summary.\n\nText: {item['passage']}")


FORMATTERS = [summary_formatter, elaboration_formatter]


def words(text: str) -> list[str]:
    """Lowercased words (``\\b\\w+\\b``) of ``text``."""
    return _WORD.findall(text.lower())


def level_words(c1: str, c2: str, min_words: int = 4, max_words: int = 48) -> float:
    """0.5 when both texts have between ``min_words`` and ``max_words`` whitespace-separated words, else 0."""
    return 0.5 if all(min_words <= len(c.split()) <= max_words for c in (c1, c2)) else 0.0


def level_ratio(c1: str, c2: str) -> float:
    """Length ratio r = len(c2) / len(c1) (stripped characters): 1 on [1.6, 3.2], linear to 0 at 1.1 and at 5.0,
    0 outside (1.1, 5.0) and for an empty c1."""
    a = len(c1.strip())
    if a == 0:
        return 0.0
    r = len(c2.strip()) / a
    if 1.6 <= r <= 3.2:
        return 1.0
    if 1.1 <= r < 1.6:
        return (r - 1.1) / 0.5
    if 3.2 < r <= 5.0:
        return (5.0 - r) / 1.8
    return 0.0


def level_vocabulary(c1: str, c2: str) -> float:
    """Unique-word ratio u = |set(words(c2))| / |set(words(c1))|: 0.5 for u >= 2, 0.5 (u - 1.3) / 0.7 on
    [1.3, 2), 0 below 1.3 or when c1 has no word."""
    n1 = len(set(words(c1)))
    if n1 == 0:
        return 0.0
    u = len(set(words(c2))) / n1
    if u >= 2.0:
        return 0.5
    if u >= 1.3:
        return 0.5 * (u - 1.3) / 0.7
    return 0.0


def transitions_in(text: str) -> set[str]:
    """The ``TRANSITIONS`` phrases that occur in ``text`` as whole words."""
    padded = f" {' '.join(words(text))} "
    return {t for t in TRANSITIONS if f" {t} " in padded}


def content_jaccard(c1: str, c2: str) -> float:
    """Jaccard similarity of the two texts' word sets without ``STOPWORDS`` (0 when both are empty)."""
    s1, s2 = set(words(c1)) - STOPWORDS, set(words(c2)) - STOPWORDS
    union = s1 | s2
    return len(s1 & s2) / len(union) if union else 0.0


def level_style(c1: str, c2: str) -> float:
    """0.4 t + 0.6 min(J, 0.03) / 0.03: t = 0 without a transition phrase in c2, else min(1, 0.4 + 0.1 (k - 1))
    for k distinct phrases; J = :func:`content_jaccard`."""
    k = len(transitions_in(c2))
    t = 0.0 if k == 0 else min(1.0, 0.4 + 0.1 * (k - 1))
    return 0.4 * t + 0.6 * min(content_jaccard(c1, c2), 0.03) / 0.03


def writing_score(c1: str, c2: str, min_words: int = 4, max_words: int = 48) -> float:
    """The level reward of one summary ``c1`` and elaboration ``c2`` (module docstring), in [0, 3]."""
    total = level_words(c1, c2, min_words, max_words)
    if total == 0.0:
        return 0.0
    for level in (level_ratio, level_vocabulary):
        gained = level(c1, c2)
        if gained == 0.0:
            return total
        total += gained
    return total + level_style(c1, c2)


def writing_reward(completions1: list[str], completions2: list[str]) -> list[float]:
    """Joint reward per aligned pair of completions (:func:`writing_score` with the default limits)."""
    if len(completions1) != len(completions2):
        raise ValueError(f"the two agents' completion lists must have the same length; got {len(completions1)} "
                         f"and {len(completions2)}.")
    return [writing_score(a, b) for a, b in zip(completions1, completions2)]


set_reward_range(writing_reward, 0.0, 3.0)
