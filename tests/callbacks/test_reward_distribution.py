"""Reward-distribution histograms and files of the iterative trainers (docs/preference.md §3.8)."""

from __future__ import annotations

import json

import pytest
from iterative_helpers import iter_args, make_trainer

from comlrl_lightning.distributions import (
    bin_edges,
    distribution_record,
    histogram,
    resolve_reward_range,
    svg_chart,
    write_record,
)
from comlrl_lightning.envs.cooperative import cooperative_reward
from comlrl_lightning.rewards import set_reward_range


def test_edges_counts_and_closed_last_bin():
    edges = bin_edges(0.0, 3.0)
    assert len(edges) == 17 and edges[0] == 0.0 and edges[-1] == 3.0 and edges[1] == pytest.approx(3 / 16)
    counts = histogram([0.0, 0.5, 1.5, 3.0], 0.0, 3.0)
    # 0.0 -> bin 0; 0.5 / 0.1875 = 2.67 -> bin 2; 1.5 / 0.1875 = 8 -> bin 8; 3.0 (= hi) -> last bin
    assert sum(counts) == 4 and counts[0] == 1 and counts[2] == 1 and counts[8] == 1 and counts[15] == 1
    # clipped into the range; non-finite dropped
    assert histogram([-5.0, 9.0, float("nan"), float("inf")], 0.0, 3.0) == [1] + [0] * 14 + [1]


def test_record_keys_and_no_density(tmp_path):
    rec = distribution_record(2, 0.0, 3.0, {"target": [3.0], "comparator": [2.0]}, {"target": [], "comparator": []})
    assert set(rec) == {"iteration", "reward_min", "reward_max", "num_bins", "bin_edges", "bin_centers",
                        "candidate", "selected"}
    assert rec["candidate"]["target"] == {"sample_count": 1, "mean": 3.0, "counts": [0] * 15 + [1],
                                          "raw_rewards": [3.0]}
    assert rec["selected"]["comparator"]["mean"] is None
    assert "density" not in json.dumps(rec)
    path = write_record(tmp_path, rec)
    assert path.name == "iteration_0002.json" and json.loads(path.read_text()) == rec
    empty = distribution_record(3, 0.0, 1.0, {}, {})
    assert write_record(tmp_path, empty) is None


def test_reward_range_is_required_and_checked():
    def f(a, b):
        return [0.0]

    with pytest.raises(ValueError, match="reward_func.reward_range"):
        resolve_reward_range(f)
    for bad, msg in (("ab", "two-item"), ((0, float("inf")), "finite"), ((2, 1), "less than")):
        f.reward_range = bad
        with pytest.raises(ValueError, match=msg):
            resolve_reward_range(f)
    assert resolve_reward_range(set_reward_range(f, 0, 3)) == (0.0, 3.0)


def test_charts_are_small_svgs():
    rec = distribution_record(1, 0.0, 3.0, {"target": [1.0, 2.0], "comparator": [0.5]}, {})
    for style in ("line", "bar"):
        html = svg_chart(rec, "candidate", style)
        assert 'width="240"' in html and 'height="80"' in html
        assert ">reward</text>" in html and ">count</text>" in html and "Candidate Reward Distribution" in html
        assert "#e87030" in html and "#6e6e6e" in html


def test_trainer_writes_one_distribution_file_per_round(tiny_model_dir, tmp_path):
    args = iter_args(num_iterations=2, log_reward_distribution=True)
    tr = make_trainer(tiny_model_dir, tmp_path, args=args, num_items=3)
    metrics = tr.train()
    files = sorted((tmp_path / "reward_distributions").glob("iteration_*.json"))
    assert [f.name for f in files] == ["iteration_0001.json", "iteration_0002.json"]
    rec = json.loads(files[0].read_text())
    # 3 items x 4 candidates on each side, raw rewards within the declared range [0, 1.5]
    assert rec["candidate"]["target"]["sample_count"] == 12 and rec["candidate"]["comparator"]["sample_count"] == 12
    assert rec["reward_min"] == 0.0 and rec["reward_max"] == 1.5
    replay = json.loads((tmp_path / "preference_replay" / "iteration_0001.json").read_text())
    # replay mode "current": the selected pairs are exactly the round's new pairs
    assert sorted(rec["selected"]["target"]["raw_rewards"]) == sorted(p["target_raw_reward"] for p in replay["pairs"])
    assert sorted(rec["selected"]["comparator"]["raw_rewards"]) == sorted(
        p["comparator_raw_reward"] for p in replay["pairs"])
    assert metrics["iter/reward_distribution/current_iteration"] == 2.0


def test_trainer_without_reward_range_fails_at_construction(tiny_model_dir, tmp_path):
    def reward(a, b):
        return cooperative_reward(a, b)

    with pytest.raises(ValueError, match="reward_func.reward_range"):
        make_trainer(tiny_model_dir, tmp_path, args=iter_args(log_reward_distribution=True), reward_func=reward)
