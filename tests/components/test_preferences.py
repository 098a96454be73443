"""Pair selection on the spec's worked examples (docs/preference.md §3.4, §3.5), the pair record
(docs/preference.md §3.7), offline pairs."""

from __future__ import annotations

import json
import random

import pytest

from comlrl_lightning.generation import Samples
from comlrl_lightning.preferences import (
    PreferencePair,
    build_offline_pairs,
    select_iterative_pairs,
    select_offline_pairs,
)

# --- offline selection (docs/preference.md §3.4) ----------------------------------------------------------------------

R = [1, 3, 3, 0, 2]
# Every ordered pair with a positive gap, in enumeration order (i, then j), worked out by hand:
# gaps (1,3)=3 (2,3)=3 (1,0)=2 (2,0)=2 (4,3)=2 (0,3)=1 (1,4)=1 (2,4)=1 (4,0)=1; (1,2) is a tie.
ENUMERATED = [(0, 3), (1, 0), (1, 3), (1, 4), (2, 0), (2, 3), (2, 4), (4, 0), (4, 3)]


def test_reward_gap_spec_example():
    assert select_offline_pairs(R, "reward_gap", 4) == [(1, 3), (2, 3), (1, 0), (2, 0)]


def test_reward_gap_without_limit_keeps_every_pair_by_gap():
    assert select_offline_pairs(R, "reward_gap", None) == [
        (1, 3), (2, 3), (1, 0), (2, 0), (4, 3), (0, 3), (1, 4), (2, 4), (4, 0)
    ]


def test_all_spec_example():
    assert select_offline_pairs(R, "all", None) == ENUMERATED


def test_ties_give_nothing():
    assert select_offline_pairs([2.0, 2.0, 2.0], "reward_gap", 4) == []
    assert select_offline_pairs([2.0, 2.0, 2.0], "all", None) == []
    assert select_offline_pairs([2.0, 2.0], "random", 4, random.Random(0)) == []
    assert select_offline_pairs([0.5], "reward_gap", None) == []
    assert select_offline_pairs([0.0, 1.0], "reward_gap", 1) == [(1, 0)]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_is_a_seeded_shuffle_of_the_candidates(seed):
    got = select_offline_pairs(R, "random", 4, random.Random(seed))
    assert got == select_offline_pairs(R, "random", 4, random.Random(seed))
    assert len(got) == 4 and len(set(got)) == 4
    assert set(got) <= set(ENUMERATED)
    assert (1, 2) not in got and (2, 1) not in got
    # Python's random.shuffle over the enumerated candidates, then the first `limit` (docs/preference.md §3.4).
    expected = list(ENUMERATED)
    random.Random(seed).shuffle(expected)
    assert got == expected[:4]

    everything = select_offline_pairs(R, "random", None, random.Random(seed))
    assert sorted(everything) == ENUMERATED


def test_random_differs_across_seeds():
    draws = {tuple(select_offline_pairs(R, "random", None, random.Random(s))) for s in range(6)}
    assert len(draws) > 1


def test_unknown_offline_selection():
    with pytest.raises(ValueError, match="pair_selection must be one of: reward_gap, all, random") as err:
        select_offline_pairs(R, "comparator_reward", 4)
    assert "'comparator_reward'" in str(err.value)


# --- iterative selection (docs/preference.md §3.5) --------------------------------------------------------------------

C = [1, 0.5, 2, 0, 1, 3]
P = [0, 0.5, 3, 1, 0.9, 0, 5]
# By hand: j=0 current (|gap| 1, p 0); j=1 tie; j=2 comparator (1, p 3); j=3 comparator (1, p 1);
# j=4 current (0.1, p 0.9); j=5 current (3, p 0); j=6 has no current candidate.
WINNERS = {0: "current", 2: "comparator", 3: "comparator", 4: "current", 5: "current"}


def test_iterative_comparator_reward_spec_example():
    assert select_iterative_pairs(C, P, "comparator_reward", 3) == [(2, "comparator"), (3, "comparator"),
                                                                    (4, "current")]
    # Without a limit: p descending, then |gap| descending (j=5 before j=0: both p=0, gaps 3 > 1).
    assert [j for j, _ in select_iterative_pairs(C, P, "comparator_reward", None)] == [2, 3, 4, 5, 0]


def test_iterative_reward_gap_spec_example():
    expected = [(5, "current"), (0, "current"), (2, "comparator")]
    assert select_iterative_pairs(C, P, "reward_gap", 3) == expected
    assert [j for j, _ in select_iterative_pairs(C, P, "reward_gap", None)] == [5, 0, 2, 3, 4]


def test_iterative_all():
    assert select_iterative_pairs(C, P, "all", None) == sorted(WINNERS.items())


@pytest.mark.parametrize("seed", [0, 5])
def test_iterative_random(seed):
    got = select_iterative_pairs(C, P, "random", 3, random.Random(seed))
    assert got == select_iterative_pairs(C, P, "random", 3, random.Random(seed))
    assert len(got) == 3 and len({j for j, _ in got}) == 3
    for j, w in got:
        assert WINNERS[j] == w
    everything = select_iterative_pairs(C, P, "random", None, random.Random(seed))
    assert sorted(everything) == sorted(WINNERS.items())


def test_iterative_index_aligned_only():
    # M < N: only the first M indices are compared.
    assert select_iterative_pairs([5, 5, 5], [1], "all", None) == [(0, "current")]
    assert select_iterative_pairs([1, 1], [1, 1], "comparator_reward", None) == []
    with pytest.raises(ValueError, match="comparator_reward"):
        select_iterative_pairs(C, P, "best", 3)


# --- the pair record (docs/preference.md §3.6, §3.7) ------------------------------------------------------------------

SPEC_KEYS = {
    "prompts", "winner_completions", "loser_completions", "winner_reward", "loser_reward",
    "candidate_reward_mean", "raw_rewards", "target_raw_reward", "comparator_raw_reward",
}


def _pair(**overrides) -> PreferencePair:
    fields = dict(prompts=["p0", "p1"], winner_completions=["w0", "w1"], loser_completions=["l0", "l1"],
                  winner_reward=2, loser_reward=0.5, candidate_reward_mean=1.25,
                  prompt_token_ids=[[1], [2]], winner_token_ids=[[3], [4]], loser_token_ids=[[5], [6]])
    fields.update(overrides)
    return PreferencePair(**fields)


def test_to_json_has_exactly_the_spec_keys():
    rec = _pair().to_json()
    assert set(rec) == SPEC_KEYS
    assert rec == {
        "prompts": ["p0", "p1"], "winner_completions": ["w0", "w1"], "loser_completions": ["l0", "l1"],
        "winner_reward": 2.0, "loser_reward": 0.5, "candidate_reward_mean": 1.25,
        "raw_rewards": [], "target_raw_reward": None, "comparator_raw_reward": None,
    }
    assert type(rec["winner_reward"]) is float
    # Plain JSON: a dumps/loads round trip is lossless.
    assert json.loads(json.dumps(rec)) == rec

    full = _pair(raw_rewards=[3, 1], target_raw_reward=3, comparator_raw_reward=1).to_json()
    assert full["raw_rewards"] == [3.0, 1.0]
    assert full["target_raw_reward"] == 3.0 and full["comparator_raw_reward"] == 1.0


def test_from_json_round_trip():
    pair = _pair(raw_rewards=[3.0, 1.0], target_raw_reward=3.0, comparator_raw_reward=1.0)
    back = PreferencePair.from_json(json.loads(json.dumps(pair.to_json())))
    assert back.to_json() == pair.to_json()
    assert back.winner_token_ids is None  # ids are not part of the record

    short = PreferencePair.from_json(pair.to_json(), num_agents=3)
    assert short.prompts == ["p0", "p1", ""]
    assert short.winner_completions == ["w0", "w1", ""] and short.loser_completions == ["l0", "l1", ""]
    cut = PreferencePair.from_json(pair.to_json(), num_agents=1)
    assert cut.prompts == ["p0"] and cut.winner_completions == ["w0"] and cut.loser_completions == ["l0"]


def test_from_json_defaults_and_errors():
    p = PreferencePair.from_json({"prompts": ["x"], "winner_completions": ["w"], "loser_completions": ["l"],
                                  "winner_reward": 1}, num_agents=2)
    assert p.prompts == ["x", ""]
    assert p.winner_completions == ["w", ""]
    assert (p.winner_reward, p.loser_reward, p.candidate_reward_mean) == (1.0, 0.0, 0.0)
    assert p.raw_rewards == [] and p.target_raw_reward is None and p.comparator_raw_reward is None
    with pytest.raises(ValueError, match="must be a dict"):
        PreferencePair.from_json(["not", "a", "dict"])


@pytest.mark.parametrize("edit, field", [
    (lambda r: r.pop("winner_completions"), "winner_completions"),
    (lambda r: r.update(loser_completions=[]), "loser_completions"),
    (lambda r: r.update(prompts=["p0", 3]), "prompts"),
    (lambda r: r.update(winner_reward="1.0"), "winner_reward"),
    (lambda r: r.update(loser_reward=float("nan")), "loser_reward"),
    (lambda r: r.update(raw_rewards=[1.0, None]), "raw_rewards"),
])
def test_from_json_refuses_damaged_records(edit, field):
    """Issue 14, finding 9: a record missing winner_completions (or with bad fields) never trains as empty text."""
    record = _pair(raw_rewards=[3.0, 1.0]).to_json()
    edit(record)
    with pytest.raises(ValueError, match=f"'{field}'"):
        PreferencePair.from_json(record, num_agents=2)


# --- building offline pairs from samples --------------------------------------------------------------------

def _samples(agent: str) -> Samples:
    """Two items x three candidates; ids encode (agent, item, candidate) so the test can tell them apart."""
    a = 1 if agent == "A" else 2
    return Samples(
        prompt_ids=[[a, 0], [a, 1]],
        completion_ids=[[[a, 0, c] for c in range(3)], [[a, 1, c] for c in range(3)]],
        texts=[[f"{agent}0{c}" for c in range(3)], [f"{agent}1{c}" for c in range(3)]],
    )


# Processed reward per joint response (raw = -processed: pairs must follow the processed value).
TABLE = {("A00", "B00"): 1.0, ("A01", "B01"): 3.0, ("A02", "B02"): 2.0,
         ("A10", "B10"): 5.0, ("A11", "B11"): 5.0, ("A12", "B12"): 5.0}


def test_build_offline_pairs():
    calls = []

    def score(prompts, texts, item, index):
        calls.append((list(prompts), list(texts), item, index))
        r = TABLE[tuple(texts)]
        return r, -r

    items = [{"id": "x"}, {"id": "y"}]
    prompts = [["PA0", "PA1"], ["PB0", "PB1"]]
    pairs, stats = build_offline_pairs(items, prompts, [_samples("A"), _samples("B")], score, "reward_gap", 2,
                                       random.Random(0), item_offset=10)

    assert calls == [
        (["PA0", "PB0"], ["A00", "B00"], {"id": "x"}, 10),
        (["PA0", "PB0"], ["A01", "B01"], {"id": "x"}, 10),
        (["PA0", "PB0"], ["A02", "B02"], {"id": "x"}, 10),
        (["PA1", "PB1"], ["A10", "B10"], {"id": "y"}, 11),
        (["PA1", "PB1"], ["A11", "B11"], {"id": "y"}, 11),
        (["PA1", "PB1"], ["A12", "B12"], {"id": "y"}, 11),
    ]
    # Item 0: rewards [1, 3, 2] -> gaps (1,0)=2, (1,2)=1, (2,0)=1 -> limit 2 keeps (1,0), (1,2).
    # Item 1: all tied -> nothing.
    assert [(p.winner_completions, p.loser_completions) for p in pairs] == [
        (["A01", "B01"], ["A00", "B00"]),
        (["A01", "B01"], ["A02", "B02"]),
    ]
    first, second = pairs
    assert (first.winner_reward, first.loser_reward) == (3.0, 1.0)
    assert (second.winner_reward, second.loser_reward) == (3.0, 2.0)
    assert first.candidate_reward_mean == second.candidate_reward_mean == 2.0
    assert first.prompts == ["PA0", "PB0"]
    assert first.prompt_token_ids == [[1, 0], [2, 0]]
    assert first.winner_token_ids == [[1, 0, 1], [2, 0, 1]]
    assert first.loser_token_ids == [[1, 0, 0], [2, 0, 0]]
    assert second.loser_token_ids == [[1, 0, 2], [2, 0, 2]]
    assert first.raw_rewards == [] and first.target_raw_reward is None  # offline: optional fields unset

    assert stats.num_items == 2 and stats.num_candidates == 6 and stats.num_pairs == 2
    assert stats.reward_sum == 21.0 and stats.reward_mean == 3.5


def test_build_offline_pairs_all_mode_keeps_every_untied_pair():
    def score(prompts, texts, item, index):
        return TABLE[tuple(texts)], 0.0

    pairs, stats = build_offline_pairs([{}, {}], [["a", "b"], ["c", "d"]], [_samples("A"), _samples("B")],
                                       score, "all", None, random.Random(0))
    # Item 0 rewards [1, 3, 2]: (1,0), (1,2), (2,0) in (i, j) order.
    assert [(p.winner_completions[0], p.loser_completions[0]) for p in pairs] == [
        ("A01", "A00"), ("A01", "A02"), ("A02", "A00")
    ]
    assert stats.num_pairs == 3
