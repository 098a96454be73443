"""The built-in cooperative task: reward parts on hand-computed examples, declared range, data, formatters."""

from __future__ import annotations

import json
import math

import pytest

from comlrl_lightning.envs.cooperative import (
    DATA_FILE,
    FORMATTERS,
    cooperative_reward,
    elaboration_formatter,
    load_cooperative_dataset,
    novelty,
    ratio_score,
    short_answer_formatter,
)
from comlrl_lightning.rewards import RewardOracle, call_reward_function


@pytest.mark.parametrize(
    ("short", "long", "expected"),
    [
        ("abcd", "x" * 8, 1.0),              # r = 2: inside [2, 3]
        ("abcd", "x" * 10, 1.0),             # r = 2.5
        ("abcd", "x" * 12, 1.0),             # r = 3
        ("abcd", "x" * 4, math.exp(-1.0)),   # r = 1: one below the band
        ("abcd", "x" * 6, math.exp(-0.5)),   # r = 1.5
        ("abcd", "x" * 16, math.exp(-1.0)),  # r = 4: one above
        ("abcd", "x" * 20, math.exp(-2.0)),  # r = 5
        ("abcd", "", math.exp(-2.0)),        # r = 0: distance 2
        ("", "anything", 0.0),               # empty short answer
        ("   ", "anything", 0.0),            # whitespace only is empty
        ("  ab  ", " abcde ", 1.0),          # stripped: 5 / 2 = 2.5
    ],
)
def test_ratio_score(short, long, expected):
    assert ratio_score(short, long) == pytest.approx(expected, abs=1e-12)


def test_ratio_score_custom_band():
    assert ratio_score("ab", "x" * 2, low=1.0, high=1.0) == 1.0
    assert ratio_score("ab", "x" * 6, low=1.0, high=2.0) == pytest.approx(math.exp(-1.0))


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("a b c", "c d", 0.75),            # union {a, b, c, d}, overlap {c}
        ("red blue", "green yellow", 1.0),
        ("A b", "a B", 0.0),               # lowercased: the same set
        ("one two", "two two three", 1 - 1 / 3),
        ("", "", 0.0),
        ("", "words here", 1.0),
    ],
)
def test_novelty(a, b, expected):
    assert novelty(a, b) == pytest.approx(expected, abs=1e-12)


def test_cooperative_reward_examples():
    # "ab cd" (5 chars) and "ef gh ij kl" (11 chars): r = 2.2 -> 1; disjoint words -> novelty 1.
    # "sun" (3) and "sun sun sun" (11): r = 11/3 -> exp(-(11/3 - 3)); same word set -> novelty 0.
    # "a b" (3) and "b c d e f g" (11): r = 11/3 as above; union 7 words, overlap {b} -> novelty 6/7.
    got = cooperative_reward(["ab cd", "sun", "a b"], ["ef gh ij kl", "sun sun sun", "b c d e f g"])
    expected = [1.0 + 0.5, math.exp(-(11 / 3 - 3)), math.exp(-(11 / 3 - 3)) + 0.5 * 6 / 7]
    assert got == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError, match="same length"):
        cooperative_reward(["a"], ["b", "c"])


def test_reward_range_and_bounds():
    assert cooperative_reward.reward_range == (0.0, 1.5)
    lo, hi = cooperative_reward.reward_range
    samples = ["", "a", "a b", "rivers flow", "rivers flow to the sea and the sea is wide", "x" * 40]
    values = cooperative_reward([s for s in samples for _ in samples], [t for _ in samples for t in samples])
    assert all(lo <= v <= hi for v in values)
    assert max(values) <= hi and min(values) >= lo


def test_reward_through_the_oracle():
    # Two positional parameters for two agents: dispatched as f(c1, c2), one joint response per call.
    assert call_reward_function(cooperative_reward, ["p"], [["ab cd"], ["ef gh ij kl"]]) == [1.5]
    oracle = RewardOracle(cooperative_reward)
    assert oracle.score(["p1", "p2"], ["ab cd", "ef gh ij kl"], {"prompt": "p"}, 0) == (1.5, 1.5)


def test_dataset_splits():
    shipped = [json.loads(line) for line in DATA_FILE.read_text().splitlines() if line.strip()]
    full = load_cooperative_dataset("all")
    train = load_cooperative_dataset("train")
    evaluation = load_cooperative_dataset("eval")
    assert len(full) == len(shipped)
    assert len(evaluation) == 8 and len(train) == len(shipped) - 8
    assert [r["id"] for r in train] + [r["id"] for r in evaluation] == [r["id"] for r in shipped]
    for row in full:
        assert isinstance(row["prompt"], str) and row["prompt"]
        assert row["topic"] in row["prompt"]
    assert len(load_cooperative_dataset("eval", eval_size=3)) == 3
    with pytest.raises(ValueError, match="split must be one of"):
        load_cooperative_dataset("test")


def test_formatters():
    item = {"prompt": "Topic: rivers."}
    assert FORMATTERS == [short_answer_formatter, elaboration_formatter]
    short, long = (f(item) for f in FORMATTERS)
    assert short.startswith("Topic: rivers.") and long.startswith("Topic: rivers.")
    assert short != long
    assert short.endswith("Answer:") and long.endswith("Elaboration:")
