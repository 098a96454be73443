"""Replay buffer: weights, draws, in-shard sampling, round files and checkpoint state (docs/preference.md §3.7, §4)."""

from __future__ import annotations

import json
import logging
import random
import re
from collections import Counter

import pytest
import torch

from comlrl_lightning.files import json_digest
from comlrl_lightning.replay import (
    REPLAY_MODES,
    allocate_draws,
    lambda_decay_weights,
    replay_sample_size,
    rng_from_plain,
    rng_state_to_plain,
    sample_from_shard,
    select_replay,
    shard_weights,
)
from comlrl_lightning.replay_store import ReplayShard, ReplayStore


def make_pair(tag: str, i: int) -> dict:
    """A docs/preference.md §3.7 pair record; ``tag``/``i`` identify it after sampling."""
    return {
        "prompts": [f"{tag} prompt {i} a0", f"{tag} prompt {i} a1"],
        "winner_completions": [f"{tag}-{i}-w0", f"{tag}-{i}-w1"],
        "loser_completions": [f"{tag}-{i}-l0", f"{tag}-{i}-l1"],
        "winner_reward": 1.0 + i,
        "loser_reward": 0.5,
        "candidate_reward_mean": 0.75,
        "raw_rewards": [1.0 + i, 0.5],
        "target_raw_reward": 1.0 + i,
        "comparator_raw_reward": 0.5,
    }


def ident(pair: dict) -> str:
    return pair["winner_completions"][0]


def rounds(*sizes: int) -> list[list[dict]]:
    return [[make_pair(f"r{r + 1}", i) for i in range(n)] for r, n in enumerate(sizes)]


def assert_plain(obj) -> None:
    """Only the types a weights_only checkpoint can hold without allow-listing."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            assert isinstance(key, str)
            assert_plain(value)
    elif isinstance(obj, list):
        for value in obj:
            assert_plain(value)
    else:
        assert obj is None or type(obj) in (int, float, str, bool), type(obj)


# ---------------------------------------------------------------------------------------------- weights


def test_modes():
    assert REPLAY_MODES == ("current", "nearest_k", "all_history", "lambda_decay")


@pytest.mark.parametrize(
    ("lam", "expected"),
    [
        # λ^a / Σ λ^b with a = 3, 2, 1, 0 (oldest first)
        (0.5, [0.125 / 1.875, 0.25 / 1.875, 0.5 / 1.875, 1.0 / 1.875]),  # = [1, 2, 4, 8] / 15
        (0.8, [0.512 / 2.952, 0.64 / 2.952, 0.8 / 2.952, 1.0 / 2.952]),
    ],
)
def test_lambda_weights_match_hand_values(lam, expected):
    weights = lambda_decay_weights(4, lam)
    assert weights == pytest.approx(expected, abs=1e-12)
    assert sum(weights) == pytest.approx(1.0)


def test_lambda_weights_spec_rounding():
    assert [round(w, 4) for w in lambda_decay_weights(4, 0.5)] == [0.0667, 0.1333, 0.2667, 0.5333]
    assert [round(w, 4) for w in lambda_decay_weights(4, 0.8)] == [0.1734, 0.2168, 0.2710, 0.3388]


def test_lambda_weights_edges():
    assert lambda_decay_weights(3, 1.0) == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert lambda_decay_weights(3, 0.0) == [0.0, 0.0, 1.0]
    assert lambda_decay_weights(1, 0.0) == [1.0]
    assert lambda_decay_weights(1, 0.5) == [1.0]
    assert lambda_decay_weights(1, 1) == [1.0]


@pytest.mark.parametrize("lam", [-0.1, 1.5, float("nan"), float("inf")])
def test_lambda_out_of_range(lam):
    with pytest.raises(ValueError, match=r"preference_replay_lambda must be in \[0, 1\], got"):
        lambda_decay_weights(3, lam)


@pytest.mark.parametrize("num", [0, -1])
def test_lambda_needs_a_shard(num):
    with pytest.raises(ValueError, match="num_rounds >= 1"):
        lambda_decay_weights(num, 0.5)


def test_shard_weights_per_mode():
    assert shard_weights("all_history", 3) == [1.0, 1.0, 1.0]
    assert shard_weights("nearest_k", 5, k=2) == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert shard_weights("nearest_k", 2, k=5) == [1.0, 1.0]  # k > number of shards: all of them
    assert shard_weights("nearest_k", 3, k=3) == [1.0, 1.0, 1.0]
    assert shard_weights("lambda_decay", 2, lam=0.5) == pytest.approx([1 / 3, 2 / 3])
    for mode, kw in [("all_history", {}), ("nearest_k", {"k": 2}), ("lambda_decay", {"lam": 0.5})]:
        assert shard_weights(mode, 0, **kw) == []


def test_shard_weights_errors():
    with pytest.raises(ValueError, match="preference_replay_mode must be one of: current, nearest_k"):
        shard_weights("newest", 2)
    with pytest.raises(ValueError, match="'current'"):
        shard_weights("current", 2)
    with pytest.raises(ValueError, match="preference_replay_k is required"):
        shard_weights("nearest_k", 2)
    with pytest.raises(ValueError, match="preference_replay_k must be an int >= 1"):
        shard_weights("nearest_k", 2, k=0)
    with pytest.raises(ValueError, match="preference_replay_lambda is required"):
        shard_weights("lambda_decay", 2)
    with pytest.raises(ValueError, match="preference_replay_k is only valid"):
        shard_weights("all_history", 2, k=1)
    with pytest.raises(ValueError, match="preference_replay_lambda is only valid"):
        shard_weights("nearest_k", 2, k=1, lam=0.5)


def test_sample_size_rule():
    assert replay_sample_size(7, 3, [5, 2]) == 7  # configured wins
    assert replay_sample_size(None, 3, [5, 2]) == 3  # else this round's pairs
    assert replay_sample_size(None, 0, [5, 2]) == 2  # else the most recent shard
    assert replay_sample_size(None, 0, []) == 0
    with pytest.raises(ValueError, match="preference_replay_sample_size must be >= 1 or null"):
        replay_sample_size(0, 3, [5])


# ---------------------------------------------------------------------------------------------- draws


@pytest.mark.parametrize("make_rng", [lambda: random.Random(3), lambda: torch.Generator().manual_seed(3)])
def test_allocate_draws_sum_determinism_zero_weight(make_rng):
    weights = [0.0, 1.0, 0.0, 2.0, 0.0]
    a = allocate_draws(weights, 50, make_rng())
    assert sum(a) == 50
    assert a[0] == a[2] == a[4] == 0
    assert a == allocate_draws(weights, 50, make_rng())
    assert allocate_draws(weights, 0, make_rng()) == [0] * 5
    assert allocate_draws([], 10, make_rng()) == []


def test_allocate_draws_is_one_categorical_draw_per_pair():
    # S independent categorical draws, i.e. exactly what random.choices does with the same weights.
    weights = [1.0, 2.0, 5.0]
    counts = allocate_draws(weights, 30, random.Random(11))
    picks = random.Random(11).choices(range(3), weights=weights, k=30)
    assert counts == [picks.count(i) for i in range(3)]


@pytest.mark.parametrize("make_rng", [lambda: random.Random(0), lambda: torch.Generator().manual_seed(0)])
def test_allocate_draws_follows_weights(make_rng):
    weights = lambda_decay_weights(4, 0.5)
    counts = allocate_draws(weights, 20_000, make_rng())
    for count, w in zip(counts, weights):
        assert abs(count / 20_000 - w) < 0.02


def test_allocate_draws_errors():
    with pytest.raises(ValueError, match="every shard weight is 0"):
        allocate_draws([0.0, 0.0], 3, random.Random(0))
    with pytest.raises(ValueError, match="finite and >= 0"):
        allocate_draws([1.0, -1.0], 3, random.Random(0))
    with pytest.raises(TypeError, match="random.Random or a CPU torch.Generator"):
        allocate_draws([1.0], 3, 42)


@pytest.mark.parametrize("make_rng", [lambda: random.Random(5), lambda: torch.Generator().manual_seed(5)])
def test_sample_without_replacement(make_rng):
    records = list(range(10))
    rng = make_rng()
    for count in (1, 4, 10):
        out = sample_from_shard(records, count, rng)
        assert len(out) == count and len(set(out)) == count and set(out) <= set(records)
    assert sample_from_shard(records, 0, rng) == []


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("kind", ["random", "torch"])
def test_sample_cycles_full_permutations(seed, kind):
    rng = random.Random(seed) if kind == "random" else torch.Generator().manual_seed(seed)
    out = sample_from_shard(["a", "b", "c"], 8, rng)  # R = 3, n = 8: 3 + 3 + 2
    assert len(out) == 8
    assert sorted(out[0:3]) == ["a", "b", "c"]
    assert sorted(out[3:6]) == ["a", "b", "c"]
    assert len(set(out[6:8])) == 2
    assert set(Counter(out).values()) <= {2, 3}


def test_sample_blocks_are_independent_shuffles():
    rng = random.Random(0)
    firsts = {tuple(sample_from_shard([0, 1, 2], 6, rng)[:3]) for _ in range(50)}
    seconds = {tuple(sample_from_shard([0, 1, 2], 6, rng)[3:]) for _ in range(50)}
    assert len(firsts) == 6 and len(seconds) == 6  # every ordering shows up in every block


def test_sample_from_empty_shard_fails():
    with pytest.raises(ValueError, match="empty shard"):
        sample_from_shard([], 2, random.Random(0))


def test_select_replay_counts_and_shuffle():
    shards = rounds(3, 2, 4)
    weights = shard_weights("nearest_k", 3, k=2)
    out = select_replay(shards, weights, 9, random.Random(1))
    assert len(out) == 9
    assert all(not ident(p).startswith("r1-") for p in out)  # zero-weight shard never drawn
    # Same RNG draws: allocation, then per-shard samples, then one final shuffle.
    rng = random.Random(1)
    counts = allocate_draws(weights, 9, rng)
    expected = []
    for shard, c in zip(shards, counts):
        if c:
            expected += sample_from_shard(shard, c, rng)
    rng.shuffle(expected)
    assert [ident(p) for p in out] == [ident(p) for p in expected]
    assert select_replay([], [], 5, random.Random(0)) == []


# ---------------------------------------------------------------------------------------------- files


def test_file_format(tmp_path):
    store = ReplayStore(tmp_path / "replay")
    pair = make_pair("x", 0)
    pair["prompts"][0] = "Grüße, 世界 ✓"
    path = store.write_round(1, [pair])
    assert path == tmp_path / "replay" / "iteration_0001.json"
    raw = path.read_bytes().decode("utf-8")
    assert "Grüße, 世界 ✓" in raw  # ensure_ascii=False
    assert "\n" not in raw and ", " not in raw.replace("Grüße, 世界", "") and '": ' not in raw  # compact
    data = json.loads(raw)
    assert list(data) == ["iteration", "num_pairs", "pairs", "sha256"]
    assert data == {"iteration": 1, "num_pairs": 1, "pairs": [pair], "sha256": json_digest([pair])}
    assert store.write_round(12, []).name == "iteration_0012.json"
    assert store.shards == (ReplayShard(1, path, 1, json_digest([pair])),)


def test_atomic_write_leaves_no_temp_file(tmp_path):
    store = ReplayStore(tmp_path)
    store.write_round(1, rounds(2)[0])
    store.write_round(1, rounds(3)[0])  # overwrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iteration_0001.json"]
    before = (tmp_path / "iteration_0001.json").read_bytes()
    bad = make_pair("x", 0)
    bad["winner_reward"] = float("nan")
    with pytest.raises(ValueError, match="iteration_0002.json"):
        store.write_round(2, [bad])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iteration_0001.json"]
    assert (tmp_path / "iteration_0001.json").read_bytes() == before
    assert [s.num_pairs for s in store.shards] == [3]  # rewriting round 1 replaced its shard


def test_empty_round_is_not_a_shard_and_does_not_age(tmp_path):
    store = ReplayStore(tmp_path)
    a, b = rounds(3, 2)
    store.write_round(1, a)
    store.write_round(2, [])
    store.write_round(3, b)
    assert json.loads((tmp_path / "iteration_0002.json").read_text()) == {
        "iteration": 2,
        "num_pairs": 0,
        "pairs": [],
        "sha256": json_digest([]),
    }
    assert [(s.iteration, s.num_pairs) for s in store.shards] == [(1, 3), (3, 2)]
    assert store.total_pairs == 5
    # Round 1 is still one of the 2 nearest shards, and is one shard old for lambda decay.
    assert shard_weights("nearest_k", len(store.shards), k=2) == [1.0, 1.0]
    assert shard_weights("lambda_decay", len(store.shards), lam=0.5) == pytest.approx([1 / 3, 2 / 3])
    out = store.select("nearest_k", b, sample_size=40, k=2)
    assert {ident(p)[:2] for p in out} == {"r1", "r2"}


def test_load_shard_missing_and_corrupt(tmp_path):
    store = ReplayStore(tmp_path)
    path = store.write_round(1, rounds(2)[0])
    shard = store.shards[0]
    assert store.load_shard(shard) == rounds(2)[0]
    named = re.escape(str(path))

    path.write_text('{"iteration": 1, "num_pairs": 2, "pairs": [', encoding="utf-8")
    with pytest.raises(ValueError, match=named + ".*not valid JSON"):
        store.load_shard(shard)
    path.write_text("[]", encoding="utf-8")
    with pytest.raises(ValueError, match=named + ".*expected an object"):
        store.load_shard(shard)
    digest = json_digest(rounds(2)[0])
    path.write_text(json.dumps({"iteration": 1, "num_pairs": 3, "pairs": rounds(2)[0], "sha256": digest}),
                    encoding="utf-8")
    with pytest.raises(ValueError, match=named + ".*num_pairs=3"):
        store.load_shard(shard)
    path.write_text(json.dumps({"iteration": 1, "num_pairs": 2, "pairs": [1, 2], "sha256": digest}),
                    encoding="utf-8")
    with pytest.raises(ValueError, match=named + ".*list of objects"):
        store.load_shard(shard)
    path.unlink()
    with pytest.raises(FileNotFoundError, match=named + ".*missing"):
        store.load_shard(shard)


# ---------------------------------------------------------------------------------------------- select


def test_select_current_is_the_new_pairs(tmp_path):
    store = ReplayStore(tmp_path, seed=0)
    old, new = rounds(4, 3)
    store.write_round(1, old)
    store.write_round(2, new)
    state = store.rng.getstate()
    assert store.select("current", new) == new
    assert store.select("current", []) == []
    assert store.rng.getstate() == state  # no draws consumed
    with pytest.raises(ValueError, match="preference_replay_sample_size is only valid"):
        store.select("current", new, sample_size=2)
    with pytest.raises(ValueError, match="preference_replay_mode must be one of"):
        store.select("latest", new)


def test_select_replay_modes(tmp_path):
    store = ReplayStore(tmp_path, seed=1)
    r1, r2, r3 = rounds(5, 1, 2)
    for i, pairs in enumerate((r1, r2, r3), start=1):
        store.write_round(i, pairs)
    out = store.select("all_history", r3)  # S = new pairs = 2
    assert len(out) == 2
    out = store.select("nearest_k", r3, sample_size=30, k=1)
    assert {ident(p)[:2] for p in out} == {"r3"}
    assert Counter(ident(p) for p in out) == {"r3-0-w0": 15, "r3-1-w0": 15}  # 30 draws, R = 2
    out = store.select("lambda_decay", r3, sample_size=25, lam=0.0)
    assert {ident(p)[:2] for p in out} == {"r3"}
    # A round without new pairs still replays: S = size of the most recent shard.
    store.write_round(4, [])
    assert len(store.select("all_history", [])) == 2
    assert len(store.select("nearest_k", [], sample_size=7, k=2)) == 7


def test_select_reads_only_drawn_shards(tmp_path):
    store = ReplayStore(tmp_path)
    r1, r2 = rounds(2, 2)
    store.write_round(1, r1)
    store.write_round(2, r2)
    (tmp_path / "iteration_0001.json").write_text("garbage", encoding="utf-8")
    assert len(store.select("nearest_k", r2, k=1)) == 2  # shard 1 has weight 0: never opened
    with pytest.raises(ValueError, match="iteration_0001.json"):
        store.select("all_history", r2, sample_size=50)


def test_earlier_run_directory_is_not_imported(tmp_path, caplog):
    earlier = ReplayStore(tmp_path)
    for i, pairs in enumerate(rounds(3, 3, 3), start=1):
        earlier.write_round(i, pairs)

    caplog.set_level(logging.INFO, logger="comlrl_lightning.replay")
    store = ReplayStore(tmp_path)
    assert store.shards == ()
    new = [make_pair("fresh", i) for i in range(2)]
    store.write_round(1, new)
    store.write_round(2, new)
    records = [r for r in caplog.records if r.name == "comlrl_lightning.replay"]
    assert len(records) == 1
    assert "3 iteration file(s)" in records[0].getMessage() and "ignored" in records[0].getMessage()
    assert [s.iteration for s in store.shards] == [1, 2]
    out = store.select("all_history", new, sample_size=40)
    assert {ident(p).split("-")[0] for p in out} == {"fresh"}


# ---------------------------------------------------------------------------------------------- state


def test_rng_plain_round_trip():
    rng = random.Random(9)
    rng.gauss(0.0, 1.0)  # leaves a cached gauss_next
    state = rng_state_to_plain(rng)
    assert_plain(state)
    copy = rng_from_plain(json.loads(json.dumps(state)))
    assert [copy.random() for _ in range(5)] == [rng.random() for _ in range(5)]
    assert copy.gauss(0.0, 1.0) == rng.gauss(0.0, 1.0)
    with pytest.raises(ValueError, match="rng_state_to_plain"):
        rng_from_plain({"version": 3})


def test_state_round_trip_through_torch_checkpoint(tmp_path):
    replay_dir = tmp_path / "replay"
    store = ReplayStore(replay_dir, seed=1234)
    data = rounds(4, 0, 3, 5)
    for i, pairs in enumerate(data[:3], start=1):
        store.write_round(i, pairs)
        store.select("lambda_decay", pairs, lam=0.7)

    ckpt = tmp_path / "replay.ckpt"
    state = store.state_dict()
    assert_plain(state)
    torch.save({"datamodule": state}, ckpt)

    def continue_run(s: ReplayStore) -> list[list[str]]:
        s.write_round(4, data[3])
        drawn = [s.select("lambda_decay", data[3], lam=0.7)]
        s.write_round(5, [])
        drawn.append(s.select("lambda_decay", [], lam=0.7, sample_size=9))
        return [[ident(p) for p in d] for d in drawn]

    uninterrupted = continue_run(store)
    resumed = ReplayStore(replay_dir, seed=999)  # a different seed: the saved RNG state must win
    resumed.load_state_dict(torch.load(ckpt, weights_only=True)["datamodule"])
    assert [(s.iteration, s.num_pairs) for s in resumed.shards] == [(1, 4), (3, 3)]
    assert continue_run(resumed) == uninterrupted


def test_load_state_with_missing_files(tmp_path):
    store = ReplayStore(tmp_path / "a")
    store.write_round(1, rounds(2)[0])
    state = store.state_dict()
    other = ReplayStore(tmp_path / "b")
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "b" / "iteration_0001.json"))):
        other.load_state_dict(state)
    assert other.shards == ()
    with pytest.raises(ValueError, match="not a ReplayStore state_dict"):
        other.load_state_dict({"shards": []})


def test_edited_round_file_is_refused_naming_it(tmp_path):
    """Issue 14, finding 9: a round file edited after it was written is never used silently."""
    store = ReplayStore(tmp_path)
    path = store.write_round(1, rounds(2)[0])
    shard = store.shards[0]
    named = re.escape(str(path))
    data = json.loads(path.read_text(encoding="utf-8"))
    data["pairs"][0]["winner_completions"][0] = "an edited answer"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=named + ".*modified.*in the file"):
        store.load_shard(shard)
    # a consistent rewrite (digest recomputed) still disagrees with the digest the index recorded
    data["sha256"] = json_digest(data["pairs"])
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=named + ".*modified.*replay index"):
        store.load_shard(shard)
    # ... also after a resume: the digest travels in the state
    restored = ReplayStore(tmp_path)
    restored.load_state_dict(store.state_dict())
    with pytest.raises(ValueError, match=named + ".*replay index"):
        restored.load_shard(restored.shards[0])
    # a file without a digest is refused too
    del data["sha256"]
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=named + ".*sha256"):
        store.load_shard(shard)
