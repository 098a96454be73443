"""The cooperative writing task's reward levels (comlrl_lightning/envs/writing.py) against values computed by hand,
and its shipped data."""

from __future__ import annotations

import math

import pytest

from comlrl_lightning.envs import writing as w

SHORT = "Bees live in big colonies."  # 5 words, 26 characters, 5 unique words


def test_level_words_limits_both_texts():
    assert w.level_words("one two three four", "a b c d e") == 0.5
    assert w.level_words("one two three", "a b c d e") == 0.0  # 3 < min_words 4
    assert w.level_words("one two three four", " ".join(["x"] * 49)) == 0.0  # 49 > max_words 48
    assert w.level_words("one two", "a b", min_words=2, max_words=2) == 0.5


@pytest.mark.parametrize(("n2", "expected"), [
    (26, 0.0),                    # r = 1.0 < 1.1
    (39, (1.5 - 1.1) / 0.5),      # r = 1.5: on the ramp up, 0.8
    (52, 1.0),                    # r = 2.0
    (26 * 4, (5.0 - 4.0) / 1.8),  # r = 4.0: on the ramp down, 0.5556
    (26 * 6, 0.0),                # r = 6.0 > 5.0
])
def test_level_ratio_by_hand(n2, expected):
    assert w.level_ratio(SHORT, "x" * n2) == pytest.approx(expected)


def test_level_ratio_empty_summary_and_stripping():
    assert w.level_ratio("   ", "anything") == 0.0
    assert w.level_ratio("  ab  ", "abcd") == 1.0  # 4 / 2 = 2 after stripping


def test_level_vocabulary_by_hand():
    c1 = "a b c d e f g h i j"  # 10 unique words
    assert w.level_vocabulary(c1, " ".join(f"w{k}" for k in range(20))) == 0.5           # u = 2.0
    assert w.level_vocabulary(c1, " ".join(f"w{k}" for k in range(16))) == pytest.approx(0.5 * 0.3 / 0.7)  # 1.6
    assert w.level_vocabulary(c1, " ".join(f"w{k}" for k in range(12))) == 0.0           # u = 1.2 < 1.3
    assert w.level_vocabulary(c1, "w w w w w w w w w w w w w w w w w w w w") == 0.0      # repeats count once
    assert w.level_vocabulary("...", "words here") == 0.0                                # c1 has no word


def test_transitions_are_whole_words_and_phrases():
    assert w.transitions_in("For example, bees dance. However, wasps do not.") == {"for example", "however"}
    assert w.transitions_in("Thusly the bees also flew") == {"also"}  # "thusly" is not "thus"
    assert w.transitions_in("no connective here") == set()


def test_content_jaccard_drops_stopwords():
    # content words: {bees, make, honey} and {honey, sweet}: 1 shared of 4
    assert w.content_jaccard("The bees make honey", "Honey is sweet") == pytest.approx(0.25)
    assert w.content_jaccard("the and of", "is a the") == 0.0


def test_level_style_by_hand():
    # k = 2 transitions -> t = 0.5; J = 0.25 >= 0.03 -> 1: 0.4 * 0.5 + 0.6 = 0.8
    assert w.level_style("The bees make honey", "Honey is sweet; for example, however, it is") == pytest.approx(0.8)
    # no transition, J = 1/100 -> 0.6 * 0.01 / 0.03 = 0.2
    c1 = " ".join(f"a{k}" for k in range(50))
    c2 = "a0 " + " ".join(f"b{k}" for k in range(49))
    assert w.content_jaccard(c1, c2) == pytest.approx(1 / 99)
    assert w.level_style(c1, c2) == pytest.approx(0.6 * (1 / 99) / 0.03)


def test_writing_score_levels_stop_at_the_first_zero():
    c1 = "Bees make honey in colonies."  # 5 words, 28 characters, 5 unique
    assert w.writing_score("Bees", "long enough text here now") == 0.0  # level 1 fails
    assert w.writing_score(c1, c1) == 0.5  # r = 1: level 2 is 0, the reward stops at 0.5
    # c2 has 56 characters: r = 56 / 28 = 2 -> 1.0; 10 unique words / 5 = 2 -> 0.5; style: one transition (for
    # example) -> t = 0.4, content words {bees, make, honey, colonies} vs {example, honey, sweet, workers, store,
    # hives}: J = 1/9 >= 0.03 -> 1; total 0.5 + 1 + 0.5 + 0.4 * 0.4 + 0.6 = 2.76
    c2 = "For example honey is sweet, workers store it in hives..."
    assert len(c2) == 56 and len(set(w.words(c2))) == 10
    assert w.writing_score(c1, c2) == pytest.approx(2.76)
    # one unique word fewer (u = 9/5 = 1.8): level 3 gives 0.5 * 0.5 / 0.7, the rest is unchanged
    c2b = "For example honey is sweet, honey is stored in hives..."
    assert len(c2b) == 55 and len(set(w.words(c2b))) == 8
    assert w.writing_score(c1, c2b) == pytest.approx(0.5 + 1.0 + 0.5 * (8 / 5 - 1.3) / 0.7 + 0.16 + 0.6)
    assert 0.0 <= w.writing_score(c1, c2) <= 3.0


def test_vocabulary_zero_stops_before_style():
    c1 = "Bees make honey in colonies."
    c2 = "Bees make honey in colonies. Bees make honey in colonies."  # r = 57/28 in band, u = 1 -> stop at 1.5
    assert w.level_ratio(c1, c2) == 1.0 and w.level_vocabulary(c1, c2) == 0.0
    assert w.writing_score(c1, c2) == 1.5


def test_writing_reward_batch_range_and_length_check():
    assert w.writing_reward.reward_range == (0.0, 3.0)
    assert w.writing_reward(["a b c d", "x"], ["a b c d", "y"]) == [0.5, 0.0]
    with pytest.raises(ValueError, match="same length"):
        w.writing_reward(["a"], [])


def test_shipped_items_and_formatters():
    train, held_out, every = w.load_writing_items("train"), w.load_writing_items("eval"), w.load_writing_items("all")
    assert len(every) >= 40 and len(held_out) == w.NUM_EVAL and len(train) + len(held_out) == len(every)
    assert len({r["topic"] for r in every}) == len(every)
    assert {r["id"] for r in train}.isdisjoint(r["id"] for r in held_out)
    for r in every:
        assert r["prompt"] == r["passage"] and 20 <= len(r["passage"].split()) <= 60
    prompts = [f(every[0]) for f in w.FORMATTERS]
    assert all(every[0]["passage"] in p for p in prompts) and prompts[0] != prompts[1]
    with pytest.raises(ValueError, match="split must be one of"):
        w.load_writing_items("test")
    assert math.isfinite(sum(w.writing_reward([p for p in prompts], list(reversed(prompts)))))
