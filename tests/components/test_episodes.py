"""The model-free actor-critic episode builder: records, reward spreading, TD targets, returns and advantages
against values computed by hand, and the turn loop driven by stub callables."""

from __future__ import annotations

import pytest
import torch

from comlrl_lightning.losses import reward_to_go, td_advantages
from comlrl_lightning.multiturn.episodes import (
    EpisodeSample,
    finish_episode,
    reward_matrix,
    run_episode,
    run_episodes,
    score_turn,
    turn_summary,
)
from comlrl_lightning.rewards import RewardError


def _turn(t: int, agents: int = 2, k: int = 1) -> list[list[EpisodeSample]]:
    return [[EpisodeSample(j, t, g, 0, [1, 2], [3, 4]) for g in range(k)] for j in range(agents)]


def test_td_targets_returns_and_advantages_by_hand():
    # one agent, three turns, γ = 0.5, β = 0.5
    rewards, kls, values = [1.0, 2.0, 3.0], [0.2, 0.4, 0.0], [10.0, 20.0, 30.0]
    turns = [_turn(t, agents=1) for t in range(3)]
    for t in range(3):
        score_turn(turns[t], [[rewards[t]]], [[values[t]]], [[kls[t]]], kl_coef=0.5)
    samples = finish_episode(turns, discount=0.5)
    # r̃ = r − β·KL = [0.9, 1.8, 3.0]
    assert [s.shaped for s in samples] == pytest.approx([0.9, 1.8, 3.0])
    # y_0 = 0.9 + 0.5·20, y_1 = 1.8 + 0.5·30, y_2 = 3.0 (no bootstrap after the last turn)
    assert [s.target for s in samples] == pytest.approx([10.9, 16.8, 3.0])
    # G_t = Σ_{u≥t} r̃_u, undiscounted
    assert [s["return"] for s in samples] == pytest.approx([5.7, 4.8, 3.0])
    targets = torch.tensor([s.target for s in samples])
    old = torch.tensor([s.old_value for s in samples])
    assert td_advantages(targets, old).tolist() == pytest.approx([0.9, -3.2, -27.0])
    # z-normalised over the group: mean −9.7667, population std 12.3002
    norm = td_advantages(targets, old, normalize=True)
    assert norm.tolist() == pytest.approx([0.86719, 0.53387, -1.40106], abs=1e-4)


def test_two_agents_are_separate_trajectories_in_agent_generation_turn_order():
    turns = [_turn(0), _turn(1)]
    score_turn(turns[0], [[1.0], [4.0]], [[0.0], [0.0]], None, kl_coef=0.5)
    score_turn(turns[1], [[2.0], [8.0]], [[3.0], [5.0]], None, kl_coef=0.5)
    samples = finish_episode(turns, discount=1.0)
    assert [(s.agent, s.turn) for s in samples] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [s.kl for s in samples] == [None] * 4 and [s.shaped for s in samples] == [1.0, 2.0, 4.0, 8.0]
    assert [s.target for s in samples] == [1.0 + 3.0, 2.0, 4.0 + 5.0, 8.0]  # each agent bootstraps on its own V
    assert [s.return_to_go for s in samples] == [3.0, 2.0, 12.0, 8.0]
    assert reward_to_go(torch.tensor([[1.0, 2.0], [4.0, 8.0]])).tolist() == [[3.0, 2.0], [12.0, 8.0]]


def test_reward_matrix_spreads_one_k_or_n_values():
    assert reward_matrix([2.0], 2, 3, "x", "IAC") == ([[2.0] * 3, [2.0] * 3], 2.0)
    assert reward_matrix([1.0, 2.0, 3.0], 2, 3, "x", "IAC") == ([[1.0, 2.0, 3.0]] * 2, 2.0)  # K values
    assert reward_matrix([1.0, 3.0], 2, 3, "x", "IAC") == ([[1.0] * 3, [3.0] * 3], 2.0)  # N values
    with pytest.raises(RewardError, match=r"either 1 or N values .* got 4 values on x \(N=2, num_generations=3\)"):
        reward_matrix([1.0] * 4, 2, 3, "x", "IAC")


def test_run_episode_calls_in_turn_order_and_stops_early():
    calls: list[tuple] = []

    def sample(agent, turn, prompt):
        calls.append(("sample", agent, turn, prompt))
        return [agent, turn], [[7, 8]], [f"a{agent}t{turn}"]

    def reward(prompts, texts, turn):
        calls.append(("reward", turn))
        r = [[1.0], [2.0]] if turn == 0 else [[10.0], [10.0]]
        return r, sum(x[0] for x in r) / 2

    def transition(previous, p_hist, r_hist, turn):
        calls.append(("transition", turn, tuple(previous)))
        return [f"next{turn}-{j}" for j in range(2)]

    samples = run_episode(2, 1, 4, ["p0", "p1"], sample, reward, values=lambda turn: [[0.5], [0.5]],
                          discount=0.9, transition=transition, early_termination_threshold=5.0,
                          critic_ids=lambda prompts, acts: [len(prompts), len(acts)], item=3)
    assert calls == [("sample", 0, 0, "p0"), ("sample", 1, 0, "p1"), ("reward", 0),
                     ("transition", 0, ("a0t0", "a1t0")), ("sample", 0, 1, "next0-0"), ("sample", 1, 1, "next0-1"),
                     ("reward", 1)]  # turn 2's mean reward 10 > 5 ends the 4-turn episode
    assert len(samples) == 4 and all(s.item == 3 and s.critic_ids == [2, 2] for s in samples)
    a0 = samples[:2]
    assert [s.target for s in a0] == pytest.approx([1.0 + 0.9 * 0.5, 10.0])
    assert a0[1].prompt_ids == [0, 1] and a0[1].text_len == len("a0t1")
    with pytest.raises(ValueError, match="needs a transition"):
        run_episode(2, 1, 2, ["p0", "p1"], sample, reward, values=lambda turn: [[0.0], [0.0]], discount=1.0)


def test_samples_read_like_dicts_and_round_trip_through_weights_only(tmp_path):
    s = EpisodeSample(1, 0, 2, "eval 0", [1], [2, 3], text_len=4, reward=0.5, return_to_go=1.5)
    assert s["reward"] == 0.5 and s["return"] == 1.5 and s["agent"] == 1
    with pytest.raises(KeyError):
        s["nope"]
    torch.save([s.as_dict()], tmp_path / "s.pt")
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)
    assert loaded[0]["return"] == 1.5 and EpisodeSample.from_dict(loaded[0]) == s
    summary = turn_summary([s, EpisodeSample(0, 0, 0, 0, [], [], reward=1.5, return_to_go=2.5, kl=0.2)], None)
    assert summary == {"reward_mean": 1.0, "expected_return": 2.0}


def test_episodes_of_a_batch_share_each_turn_call_and_equal_separate_episodes():
    # 3 episodes, 2 agents, K=2, 3 turns; episode 1 terminates after turn 1 (its mean reward 9 > 5).
    def sample(agent, turn, prompt):
        h = sum(map(ord, prompt)) % 13
        return [agent, h], [[h, g] for g in range(2)], [f"a{agent}t{turn}g{g}h{h}" for g in range(2)]

    def reward(prompts, texts, turn):
        r = 9.0 if "item1" in prompts[0] and turn == 0 else float(len(texts[0][0]) % 3)
        return [[r, r + 1], [r, r + 1]], r + 0.5

    def transition(previous, p_hist, r_hist, turn):
        return [f"{p_hist[j][0]} then {previous[j]}" for j in range(2)]

    def values(turn):  # depends on the sample only, so batching cannot change it
        return [[0.1 * (s.completion_ids[0] + s.turn) for s in samples] for samples in turn]

    def kls(turn):
        return [[0.01 * s.gen for s in samples] for samples in turn]

    prompts = [[f"item{e} p{j}" for j in range(2)] for e in range(3)]
    kw = dict(discount=0.9, kls=kls, kl_coef=0.5, early_termination_threshold=5.0)
    calls, value_calls = [], []

    def sample_level(agent, turn, level):
        calls.append((agent, turn, len(level)))
        return [sample(agent, turn, p) for p in level]

    def counted_values(turn):
        value_calls.append([len(x) for x in turn])
        return values(turn)

    batched = run_episodes(2, 2, 3, prompts, sample_level, lambda e, *a: reward(*a), counted_values,
                           transition=lambda e, *a: transition(*a), items=["x0", "x1", "x2"], **kw)
    assert calls == [(0, 0, 3), (1, 0, 3), (0, 1, 2), (1, 1, 2), (0, 2, 2), (1, 2, 2)]
    assert value_calls == [[6, 6], [4, 4], [4, 4]]
    for e in range(3):
        alone = run_episode(2, 2, 3, prompts[e], sample, reward, values, transition=transition, item=f"x{e}", **kw)
        assert [x.as_dict() for x in batched[e]] == [x.as_dict() for x in alone]
    assert len(batched[1]) == 2 * 2 * 1 and len(batched[0]) == 2 * 2 * 3
