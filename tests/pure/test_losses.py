"""Losses against values worked out by hand (plain math), gradient equivalences, and error messages."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from comlrl_lightning.losses import (
    bradley_terry_loss,
    bradley_terry_stats,
    group_advantages,
    k3_kl,
    kl_penalized_returns,
    madpo_loss,
    madpo_loss_detached_others,
    node_return,
    policy_gradient_loss,
    td_advantages,
    td_targets,
    value_loss,
)


def neg_log_sigmoid(x: float) -> float:
    return math.log(1.0 + math.exp(-x))


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(
        actual.double(), torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0
    )


# --- MADPO

# 2 agents x 3 pairs.
W = [[-1.0, -2.0, -0.5], [-3.0, -1.5, -2.0]]
L = [[-2.0, -1.0, -0.5], [-2.5, -2.5, -4.0]]
# agent margins: a0 = [1, -1, 0], a1 = [-0.5, 1, 2]; joint = [0.5, 0, 2]


def test_madpo_loss_and_stats_by_hand():
    beta = 0.5
    loss, stats = madpo_loss(torch.tensor(W), torch.tensor(L), beta)
    assert loss.shape == (3,)
    close(loss, [neg_log_sigmoid(0.25), math.log(2.0), neg_log_sigmoid(1.0)])
    close(stats["joint_margin"], [0.5, 0.0, 2.0])
    close(stats["accuracy"], 2.0 / 3.0)  # Δ = 0 is not a win
    close(stats["agent_margins"], [0.0, 2.5 / 3.0])
    close(stats["chosen_logps"], [-3.5 / 3.0, -6.5 / 3.0])
    close(stats["rejected_logps"], [-3.5 / 3.0, -9.0 / 3.0])
    assert stats["accuracy"].shape == ()


def test_madpo_stats_are_detached_and_loss_is_not():
    w = torch.tensor(W, requires_grad=True)
    loss, stats = madpo_loss(w, torch.tensor(L), 0.1)
    assert loss.requires_grad
    assert all(not v.requires_grad for v in stats.values())


def test_madpo_detached_loss_value_equals_joint_mean():
    joint = sum([neg_log_sigmoid(0.25), math.log(2.0), neg_log_sigmoid(1.0)]) / 3.0
    for i in range(2):
        close(madpo_loss_detached_others(torch.tensor(W), torch.tensor(L), 0.5, i), joint)


def test_madpo_leaf_gradients_by_hand():
    # d/dw_ib of mean_b −log σ(β Δ_b) = −β σ(−β Δ_b) / B, the same for every agent i.
    w = torch.tensor(W, requires_grad=True)
    loss, _ = madpo_loss(w, torch.tensor(L), 0.5)
    loss.mean().backward()
    per_pair = [-0.5 / (1.0 + math.exp(0.5 * d)) / 3.0 for d in (0.5, 0.0, 2.0)]
    close(w.grad, [per_pair, per_pair])


class TinyAgent(nn.Module):
    """A 'language model' scoring token sequences from fixed features: logits = Linear(features)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.proj = nn.Linear(4, 6)

    def seq_logps(self, feats: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(self.proj(feats), dim=-1)  # [B, T, V]
        return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).sum(-1)  # [B]


def _team_logps(agents, data):
    w = torch.stack([a.seq_logps(*data[i]["w"]) for i, a in enumerate(agents)])
    l_ = torch.stack([a.seq_logps(*data[i]["l"]) for i, a in enumerate(agents)])
    return w, l_


def _tiny_data(num_agents: int, batch: int = 3, length: int = 2):
    g = torch.Generator().manual_seed(123)
    return [
        {
            side: (
                torch.randn(batch, length, 4, generator=g),
                torch.randint(0, 6, (batch, length), generator=g),
            )
            for side in ("w", "l")
        }
        for _ in range(num_agents)
    ]


def test_joint_backward_equals_per_agent_detached_gradients():
    agents = [TinyAgent(seed) for seed in (0, 1, 2)]
    data = _tiny_data(3)
    beta = 0.7

    w, l_ = _team_logps(agents, data)
    madpo_loss(w, l_, beta)[0].mean().backward()
    joint_grads = [[p.grad.clone() for p in a.parameters()] for a in agents]

    for i, agent in enumerate(agents):
        for a in agents:
            a.zero_grad(set_to_none=True)
        w, l_ = _team_logps(agents, data)
        madpo_loss_detached_others(w, l_, beta, i).backward()
        for p, g in zip(agent.parameters(), joint_grads[i], strict=True):
            assert g.abs().sum() > 0
            torch.testing.assert_close(p.grad, g, atol=1e-7, rtol=1e-5)
        for k, other in enumerate(agents):  # other agents' margins are constants in loss_i
            if k != i:  # (stack's backward may hand them explicit zeros)
                assert all(p.grad is None or not p.grad.any() for p in other.parameters())


def test_shared_parameters_joint_gradient_is_sum_of_detached_gradients():
    shared = TinyAgent(0)
    agents = [shared, shared]
    data = _tiny_data(2)
    w, l_ = _team_logps(agents, data)
    madpo_loss(w, l_, 0.3)[0].mean().backward()
    joint = [p.grad.clone() for p in shared.parameters()]

    shared.zero_grad(set_to_none=True)
    for i in range(2):  # grads accumulate over the two detached losses
        w, l_ = _team_logps(agents, data)
        madpo_loss_detached_others(w, l_, 0.3, i).backward()
    for p, g in zip(shared.parameters(), joint, strict=True):
        torch.testing.assert_close(p.grad, g, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("beta", [0.0, -0.1, float("nan")])
def test_madpo_rejects_non_positive_beta(beta):
    with pytest.raises(ValueError, match="dpo_beta") as err:
        madpo_loss(torch.tensor(W), torch.tensor(L), beta)
    assert repr(beta) in str(err.value) and "> 0" in str(err.value)
    with pytest.raises(ValueError, match="dpo_beta"):
        madpo_loss_detached_others(torch.tensor(W), torch.tensor(L), beta, 0)


def test_madpo_shape_errors():
    with pytest.raises(ValueError, match="same shape"):
        madpo_loss(torch.zeros(2, 3), torch.zeros(2, 4), 0.1)
    with pytest.raises(ValueError, match="2-D"):
        madpo_loss(torch.zeros(3), torch.zeros(3), 0.1)
    with pytest.raises(ValueError, match="empty batch"):
        madpo_loss(torch.zeros(2, 0), torch.zeros(2, 0), 0.1)
    with pytest.raises(ValueError, match="agent_index"):
        madpo_loss_detached_others(torch.zeros(2, 3), torch.zeros(2, 3), 0.1, 2)


# --- reward model


def test_bradley_terry_by_hand():
    chosen = torch.tensor([1.0, 0.0, -1.0])
    rejected = torch.tensor([0.0, 0.5, -1.0])
    close(bradley_terry_loss(chosen, rejected), [neg_log_sigmoid(1.0), neg_log_sigmoid(-0.5), math.log(2.0)])
    stats = bradley_terry_stats(chosen, rejected)
    close(stats["accuracy"], 1.0 / 3.0)
    close(stats["margin"], 0.5 / 3.0)


def test_bradley_terry_gradient_and_errors():
    chosen = torch.tensor([2.0], requires_grad=True)
    bradley_terry_loss(chosen, torch.tensor([1.0])).sum().backward()
    close(chosen.grad, [-1.0 / (1.0 + math.exp(1.0))])  # −σ(−1)
    assert not bradley_terry_stats(chosen, torch.tensor([1.0]))["margin"].requires_grad
    with pytest.raises(ValueError, match="same shape"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(3))


# --- advantages


def zscore(xs: list[float], eps: float = 1e-6) -> list[float]:
    m = sum(xs) / len(xs)
    std = math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))  # population std
    return [(x - m) / max(std, eps) for x in xs]


RETURNS = [1.0, 2.0, 4.0]  # K = 3, sum 7
RAW_BY_HAND = {
    "mean": [1 - 7 / 3, 2 - 7 / 3, 4 - 7 / 3],
    "raw": [1.0, 2.0, 4.0],
    "max": [-3.0, -2.0, 0.0],
    "rloo": [1 - (2 + 4) / 2, 2 - (1 + 4) / 2, 4 - (1 + 2) / 2],  # leave-one-out mean baseline
}


@pytest.mark.parametrize("mode", ["mean", "raw", "max", "rloo"])
def test_group_advantages_without_normalization(mode):
    adv = group_advantages(torch.tensor(RETURNS), mode, normalize=False)
    assert adv.dtype == torch.float32
    close(adv, RAW_BY_HAND[mode], atol=1e-6)


@pytest.mark.parametrize("mode", ["mean", "raw", "max", "rloo"])
def test_group_advantages_normalized_are_identical_across_modes(mode):
    adv = group_advantages(torch.tensor(RETURNS, dtype=torch.float64), mode, normalize=True)
    expected = zscore(RAW_BY_HAND["mean"])
    close(adv, expected, atol=1e-12)
    close(adv, zscore(RAW_BY_HAND[mode]), atol=1e-12)


@pytest.mark.parametrize(
    ("mode", "expected"), [("mean", [0.0]), ("raw", [3.0]), ("max", [0.0]), ("rloo", [0.0])]
)
@pytest.mark.parametrize("normalize", [False, True])
def test_group_advantages_single_sample(mode, expected, normalize):
    # K = 1: rloo falls back to the mean baseline; normalisation is skipped.
    close(group_advantages(torch.tensor([3.0]), mode, normalize), expected)


@pytest.mark.parametrize("mode", ["mean", "raw", "max", "rloo"])
def test_group_advantages_equal_returns(mode):
    returns = torch.tensor([0.1, 0.1, 0.1])
    normalized = group_advantages(returns, mode, normalize=True)
    assert torch.equal(normalized, torch.zeros(3))  # 0 / max(0, eps) = 0, no rounding noise
    expected = [0.1, 0.1, 0.1] if mode == "raw" else [0.0, 0.0, 0.0]
    close(group_advantages(returns, mode, normalize=False), expected, atol=1e-7)


def test_group_advantages_std_floor_and_list_input():
    # population std 5e-8 < 1e-6 -> divide by the floor 1e-6
    adv = group_advantages([0.0, 1e-7], "mean", normalize=True)
    close(adv, [-0.5e-7 / 1e-6, 0.5e-7 / 1e-6], atol=1e-6)
    adv = group_advantages(torch.tensor([0.0, 1e-7], dtype=torch.float64), "raw", True, eps=1e-9)
    close(adv, [-1.0, 1.0], atol=1e-9)


def test_group_advantages_unknown_mode():
    with pytest.raises(ValueError, match="advantage_mode") as err:
        group_advantages(torch.tensor(RETURNS), "median", True)
    msg = str(err.value)
    assert "'median'" in msg and "mean, raw, max, rloo" in msg


def test_kl_penalized_returns_upstream_example():
    # docs/multiturn.md §11.1 case 8: β = 0.5, returns [1, 2], KLs [0.2, 0.4] -> [0.9, 1.8]
    close(kl_penalized_returns(torch.tensor([1.0, 2.0]), [0.2, 0.4], 0.5), [0.9, 1.8])
    close(kl_penalized_returns(torch.tensor([1.0, 2.0]), [0.2], 0.5), [0.9, 2.0])  # missing KL = 0
    close(kl_penalized_returns(torch.tensor([1.0, 2.0]), None, 0.5), [1.0, 2.0])


# --- tree returns


def test_tree_returns_on_hand_built_tree():
    # Root with B = 2 joint actions, rewards [1.0, 0.5].
    #   action 0 -> child A, rewards [0.2, 0.4]; A's action 1 -> grandchild with rewards [0.6, 1.0]
    #   action 1 -> child B, rewards [1.0, 0.0], both leaves (e.g. early-terminated below)
    grandchild = [node_return(0.6), node_return(1.0)]  # leaves
    child_a = [node_return(0.2), node_return(0.4, grandchild)]
    child_b = [node_return(1.0, []), node_return(0.0, None)]
    root = [node_return(1.0, child_a), node_return(0.5, child_b)]
    assert child_a == pytest.approx([0.2, 0.4 + (0.6 + 1.0) / 2])  # [0.2, 1.2]
    assert root == pytest.approx([1.0 + (0.2 + 1.2) / 2, 0.5 + (1.0 + 0.0) / 2])  # [1.7, 1.0]


def test_tree_return_with_tensors():
    r = node_return(torch.tensor(1.0), torch.tensor([0.2, 1.2]))
    assert isinstance(r, torch.Tensor)
    close(r, 1.7)


# --- actor-critic


def test_td_targets_single_trajectory():
    rewards = torch.tensor([1.0, 0.5, 2.0])
    next_values = torch.tensor([0.3, 0.7, 99.0])  # last entry has no next turn: never used
    targets = td_targets(rewards, next_values, 0.9)
    close(targets, [1.0 + 0.9 * 0.3, 0.5 + 0.9 * 0.7, 2.0])


def test_td_targets_early_termination_in_padded_batch():
    rewards = torch.tensor([[1.0, 0.5, 2.0], [0.2, -1.0, 0.0]])
    next_values = torch.tensor([[0.3, 0.7, float("nan")], [0.4, float("nan"), float("nan")]])
    terminal = torch.tensor([[False, False, True], [False, True, True]])  # row 1 stopped after turn 2
    targets = td_targets(rewards, next_values, 0.5, terminal)
    close(targets, [[1.0 + 0.5 * 0.3, 0.5 + 0.5 * 0.7, 2.0], [0.2 + 0.5 * 0.4, -1.0, 0.0]])


def test_td_targets_are_detached_and_discount_one():
    values = torch.tensor([0.3, 0.0], requires_grad=True)
    targets = td_targets(torch.tensor([1.0, 1.0]), values, 1.0)
    assert not targets.requires_grad
    close(targets, [1.3, 1.0])


def test_td_advantages():
    targets = torch.tensor([1.0, 2.0, 4.0])
    values = torch.tensor([0.5, 0.5, 0.5])
    close(td_advantages(targets, values), [0.5, 1.5, 3.5])
    close(td_advantages(targets, values, normalize=True), zscore([0.5, 1.5, 3.5]), atol=1e-6)
    close(td_advantages(targets[:1], values[:1], normalize=True), [0.5])  # one sample: unnormalised


def test_value_loss_plain_and_clipped():
    values = torch.tensor([1.0, 0.0], requires_grad=True)
    targets = torch.tensor([1.5, -1.0])
    old = torch.tensor([0.8, 0.5])
    close(value_loss(values, targets), [0.25, 1.0])
    close(value_loss(values, targets, coef=0.6), [0.6 * 0.25, 0.6 * 1.0])
    # V_clip = V_old + clip(V − V_old, ±0.2) = [1.0, 0.3] -> (y − V_clip)^2 = [0.25, 1.69]
    clipped = value_loss(values, targets, old, clip_range=0.2)
    close(clipped, [max(0.25, 0.25), max(1.0, (-1.0 - 0.3) ** 2)])
    clipped.sum().backward()
    # sample 0: d/dV (y − V)^2 = −2(y − V) = −1; sample 1: the clipped branch wins and is flat in V
    close(values.grad, [-1.0, 0.0])


def test_value_loss_errors():
    with pytest.raises(ValueError, match="old_values"):
        value_loss(torch.zeros(2), torch.zeros(2), clip_range=0.2)
    with pytest.raises(ValueError, match="value_clip_range"):
        value_loss(torch.zeros(2), torch.zeros(2), torch.zeros(2), clip_range=0.0)
    with pytest.raises(ValueError, match="same shape"):
        value_loss(torch.zeros(2), torch.zeros(3))


# --- k3 KL and PG loss


def test_k3_by_hand_is_a_sum_over_tokens():
    logps = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-0.5, -3.0]])  # δ = [0.5, -1.0]
    expected = (math.exp(0.5) - 0.5 - 1) + (math.exp(-1.0) + 1.0 - 1)
    close(k3_kl(logps, ref, torch.ones(1, 2, dtype=torch.bool)), [expected])


def test_k3_nonnegative_zero_for_identical_and_masking():
    g = torch.Generator().manual_seed(0)
    logps = -torch.rand(8, 5, generator=g) * 4
    ref = -torch.rand(8, 5, generator=g) * 4
    mask = torch.ones(8, 5, dtype=torch.bool)
    kl = k3_kl(logps, ref, mask)
    assert kl.shape == (8,) and (kl >= 0).all() and (kl > 0).all()
    assert torch.equal(k3_kl(logps, logps.clone(), mask), torch.zeros(8))
    tiny = torch.tensor([[1e-8, -1e-8, 1e-12]])  # cancellation-prone δ must not go negative
    assert (k3_kl(torch.zeros(1, 3), tiny, torch.ones(1, 3)) >= 0).all()

    # Padding after the completion changes nothing, whatever garbage it holds.
    pad_logps = torch.cat([logps, torch.full((8, 3), -1e4)], dim=1)
    pad_ref = torch.cat([ref, torch.tensor([[0.0, float("inf"), float("nan")]]).expand(8, 3)], dim=1)
    pad_mask = torch.cat([mask, torch.zeros(8, 3, dtype=torch.bool)], dim=1)
    torch.testing.assert_close(k3_kl(pad_logps, pad_ref, pad_mask), kl)
    # A 0/1 float mask works like a bool mask.
    torch.testing.assert_close(k3_kl(pad_logps, pad_ref, pad_mask.float()), kl)


def test_policy_gradient_loss_by_hand():
    nan = float("nan")
    logps = torch.tensor([[-1.0, -2.0, nan], [-0.5, -7.0, -7.0], [-3.0, -3.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)  # row 2: empty completion
    adv = torch.tensor([1.0, -2.0, 5.0])
    loss = policy_gradient_loss(logps, mask, adv)
    # per sequence −A_k · Σ_t logp: [−1·(−3), 2·(−0.5)] = [3, −1]; mean over K' = 2 non-empty sequences
    close(loss, (3.0 + -1.0) / 2)
    loss.backward()
    close(logps.grad, [[-0.5, -0.5, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_policy_gradient_loss_padding_and_all_empty():
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    base = policy_gradient_loss(logps, torch.ones(1, 2), torch.tensor([2.0]))
    padded = policy_gradient_loss(
        torch.cat([logps, torch.tensor([[-50.0, -60.0]])], dim=1),
        torch.tensor([[1, 1, 0, 0]]),
        torch.tensor([2.0]),
    )
    close(base, 6.0)
    torch.testing.assert_close(padded, base)

    empty = policy_gradient_loss(logps, torch.zeros(1, 2), torch.tensor([2.0]))
    assert empty.item() == 0.0
    empty.backward()  # still part of the graph
    close(logps.grad, [[0.0, 0.0]])
    with pytest.raises(ValueError, match="advantages"):
        policy_gradient_loss(logps, torch.ones(1, 2), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="same shape"):
        k3_kl(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 2))
