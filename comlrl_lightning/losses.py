"""Pure tensor math of the objectives: MADPO, Bradley-Terry, REINFORCE baselines, TD targets, k3 KL.

Nothing here knows about models, trainers, devices or I/O. Every function takes tensors and returns
tensors; losses are returned per example (the caller reduces) unless the spec defines the reduction,
and statistics are returned detached. Spec references: docs/preference.md §7.1 (MADPO), docs/preference.md §8.3 (reward
model), docs/multiturn.md §2.5-2.8 (returns, advantages, policy-gradient loss), docs/multiturn.md §3 (baselines),
docs/multiturn.md §4.3-4.4 (actor-critic), docs/multiturn.md §9 (reference KL).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

AdvantageMode = Literal["mean", "raw", "rloo", "max"]
ADVANTAGE_MODES: tuple[str, ...] = ("mean", "raw", "max", "rloo")
ADVANTAGE_EPS = 1e-6  # floor of the std in advantage normalisation (docs/multiturn.md §2.7, §4.4)


# --------------------------------------------------------------------------------------------------
# MADPO (docs/preference.md §7.1)
# --------------------------------------------------------------------------------------------------


def _check_pair_logps(winner_logps: Tensor, loser_logps: Tensor, beta: float) -> None:
    if not beta > 0:  # also rejects NaN
        raise ValueError(f"dpo_beta must be > 0, got {beta!r}. Set a positive temperature, e.g. 0.1.")
    if winner_logps.shape != loser_logps.shape:
        raise ValueError(
            "winner_logps and loser_logps must have the same shape [num_agents, batch], got "
            f"{tuple(winner_logps.shape)} and {tuple(loser_logps.shape)}."
        )
    if winner_logps.ndim != 2:
        raise ValueError(
            f"winner_logps and loser_logps must be 2-D [num_agents, batch], got shape "
            f"{tuple(winner_logps.shape)}."
        )
    if winner_logps.shape[0] == 0:
        raise ValueError("MADPO loss needs at least one agent (num_agents dimension is empty).")
    if winner_logps.shape[1] == 0:
        raise ValueError("MADPO loss got an empty batch (0 pairs); pass at least one preference pair.")


def madpo_loss(winner_logps: Tensor, loser_logps: Tensor, beta: float) -> tuple[Tensor, dict[str, Tensor]]:
    """Reference-free joint DPO loss of a team of agents (docs/preference.md §7.1).

    For pair b and agent i, with summed sequence log-probs w_ib = log π_i(winner_i | x_i) and
    l_ib = log π_i(loser_i | x_i)::

        Δ_ib = w_ib − l_ib            (agent margin)
        Δ_b  = Σ_i Δ_ib               (joint margin)
        loss_b = −log σ(β · Δ_b)      (computed with logsigmoid for stability)

    With separate agent parameters, one backward of ``loss.mean()`` gives every agent exactly the
    gradient of the spec's per-agent detached formulation (see :func:`madpo_loss_detached_others`).

    Args:
        winner_logps: ``[num_agents, batch]`` summed log-probs of the winning joint response.
        loser_logps: ``[num_agents, batch]`` summed log-probs of the losing joint response.
        beta: ``dpo_beta`` > 0.

    Returns:
        ``loss`` of shape ``[batch]`` (not reduced) and detached stats: ``joint_margin`` ``[batch]``,
        ``accuracy`` scalar (fraction of pairs with Δ_b > 0), ``agent_margins`` ``[num_agents]``
        (mean over the batch of Δ_ib), ``chosen_logps`` and ``rejected_logps`` ``[num_agents]``
        (means over the batch of w_ib and l_ib).
    """
    _check_pair_logps(winner_logps, loser_logps, beta)
    agent_margins = winner_logps - loser_logps  # [N, B]
    joint_margin = agent_margins.sum(dim=0)  # [B]
    loss = -F.logsigmoid(beta * joint_margin)
    with torch.no_grad():
        stats = {
            "joint_margin": joint_margin.detach().clone(),
            "accuracy": (joint_margin > 0).float().mean(),
            "agent_margins": agent_margins.detach().mean(dim=1),
            "chosen_logps": winner_logps.detach().mean(dim=1),
            "rejected_logps": loser_logps.detach().mean(dim=1),
        }
    return loss, stats


def madpo_loss_detached_others(
    winner_logps: Tensor, loser_logps: Tensor, beta: float, agent_index: int
) -> Tensor:
    """The spec's per-agent MADPO loss, other agents' margins detached (docs/preference.md §7.1).

    ``loss_i = mean_b −log σ(β · (Δ_ib + Σ_{k≠i} stopgrad(Δ_kb)))`` with Δ_kb = w_kb − l_kb.

    Its gradient w.r.t. agent i's own parameters equals that of ``madpo_loss(...)[0].mean()`` when
    agents have separate parameters. Use it when agents share parameters and the per-agent
    simultaneous-update semantics are wanted.

    Args:
        winner_logps, loser_logps: ``[num_agents, batch]`` summed sequence log-probs.
        beta: ``dpo_beta`` > 0.
        agent_index: i, in ``[0, num_agents)``.

    Returns:
        Scalar loss (mean over the batch).
    """
    _check_pair_logps(winner_logps, loser_logps, beta)
    num_agents = winner_logps.shape[0]
    if not 0 <= agent_index < num_agents:
        raise ValueError(f"agent_index must be in [0, {num_agents}), got {agent_index}.")
    margins = winner_logps - loser_logps  # [N, B]
    others = [k for k in range(num_agents) if k != agent_index]
    detached_others = margins[others].detach().sum(dim=0)  # zeros when N == 1
    return -F.logsigmoid(beta * (margins[agent_index] + detached_others)).mean()


# --------------------------------------------------------------------------------------------------
# Joint reward model (docs/preference.md §8.3)
# --------------------------------------------------------------------------------------------------


def _check_same_shape(a: Tensor, b: Tensor, names: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{names} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}.")


def bradley_terry_loss(chosen_rewards: Tensor, rejected_rewards: Tensor) -> Tensor:
    """Bradley-Terry pairwise loss of the reward model: ``loss_b = −log σ(r_c,b − r_r,b)``.

    Args:
        chosen_rewards, rejected_rewards: ``[batch]`` scalar scores of the winner and loser joint texts.

    Returns:
        ``[batch]`` per-pair loss (the trainer takes the mean).
    """
    _check_same_shape(chosen_rewards, rejected_rewards, "chosen_rewards and rejected_rewards")
    return -F.logsigmoid(chosen_rewards - rejected_rewards)


def bradley_terry_stats(chosen_rewards: Tensor, rejected_rewards: Tensor) -> dict[str, Tensor]:
    """Detached reward-model stats: ``accuracy`` = mean[r_c > r_r], ``margin`` = mean(r_c − r_r).

    Args:
        chosen_rewards, rejected_rewards: ``[batch]``.

    Returns:
        Dict of scalar tensors ``accuracy`` and ``margin``.
    """
    _check_same_shape(chosen_rewards, rejected_rewards, "chosen_rewards and rejected_rewards")
    with torch.no_grad():
        diff = chosen_rewards.detach() - rejected_rewards.detach()
        return {"accuracy": (diff > 0).float().mean(), "margin": diff.mean()}


# --------------------------------------------------------------------------------------------------
# REINFORCE-family advantages (docs/multiturn.md §2.7, §3)
# --------------------------------------------------------------------------------------------------


def normalize_advantages(advantages: Tensor, eps: float = ADVANTAGE_EPS) -> Tensor:
    """Z-normalise a group: ``(A − mean(A)) / max(std_pop(A), eps)`` over all elements.

    The std is the population (biased, ``correction=0``) std. A group of one element is returned
    unchanged (the spec normalises only when there is more than one sample). Computed in float64 and
    cast back, so that a group of equal values gives exact zeros rather than rounding noise / eps.

    Args:
        advantages: ``[K]`` (any shape; all elements form one group).
    """
    if advantages.numel() <= 1:
        return advantages
    a = advantages.double()
    centered = a - a.mean()
    std = a.std(correction=0).clamp_min(eps)
    return (centered / std).to(advantages.dtype)


def group_advantages(
    returns: Tensor | Sequence[float],
    mode: AdvantageMode | str,
    normalize: bool,
    eps: float = ADVANTAGE_EPS,
) -> Tensor:
    """Advantages of one sibling group of K returns G'_1..G'_K (one agent, one node).

    ``advantage_mode`` (docs/multiturn.md §3)::

        mean: A_k = G'_k − (1/K) Σ_l G'_l                         (MAGRPO)
        raw:  A_k = G'_k                                          (MAREINFORCE)
        max:  A_k = G'_k − max_l G'_l                             (MAReMax)
        rloo: A_k = G'_k − (1/(K−1)) Σ_{l≠k} G'_l                 (MARLOO; the mean baseline if K ≤ 1)

    Then, if ``normalize`` (``advantage_normalization``) and K > 1:
    ``Â = (A − mean(A)) / max(std_pop(A), eps)`` (see :func:`normalize_advantages`). With
    normalisation on, the four modes give identical advantages (docs/multiturn.md §3).

    Args:
        returns: ``[K]`` returns of the group, already KL-shaped if the reference KL is on.
        mode: one of ``mean``, ``raw``, ``max``, ``rloo``.
        normalize: apply the z-normalisation.
        eps: std floor, 1e-6 in the spec.

    Returns:
        ``[K]`` advantages, detached, in the dtype of ``returns`` (float32 for non-float input).
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"advantage_mode must be one of: {', '.join(ADVANTAGE_MODES)}; got {mode!r}.")
    g = torch.as_tensor(returns).detach()
    out_dtype = g.dtype if g.is_floating_point() else torch.get_default_dtype()
    if g.ndim != 1:
        raise ValueError(f"returns must be a 1-D tensor of K sibling returns, got shape {tuple(g.shape)}.")
    g = g.double()  # float64 so that equal returns cancel exactly
    k = g.numel()
    if k == 0:
        raise ValueError("group_advantages got an empty group of returns.")
    if mode == "raw":
        adv = g
    elif mode == "max":
        adv = g - g.max()
    elif mode == "rloo" and k > 1:
        adv = (k * g - g.sum()) / (k - 1)
    else:  # "mean", and "rloo" with K == 1
        adv = g - g.mean()
    if normalize:
        adv = normalize_advantages(adv, eps)
    return adv.to(out_dtype)


def kl_penalized_returns(returns: Tensor, kls: Tensor | Sequence[float] | None, coef: float) -> Tensor:
    """Reference-KL shaping of returns or rewards: ``G'_k = G_k − coef · KL_k`` (docs/multiturn.md §2.7, §9).

    Missing KL entries (``kls`` shorter than ``returns``, or None) count as 0, as upstream does.

    Args:
        returns: ``[K]``.
        kls: ``[K']`` sequence KLs with K' ≤ K, or None.
        coef: ``reference_kl_coef`` ≥ 0.
    """
    if kls is None:
        return returns
    kl = torch.as_tensor(kls, dtype=returns.dtype, device=returns.device).flatten()
    if kl.numel() > returns.numel():
        raise ValueError(f"got {kl.numel()} KL values for {returns.numel()} returns.")
    padded = torch.zeros_like(returns)
    padded[: kl.numel()] = kl
    return returns - coef * padded


# --------------------------------------------------------------------------------------------------
# Tree returns (docs/multiturn.md §2.5)
# --------------------------------------------------------------------------------------------------


def node_return(
    reward: float | Tensor, child_returns: Sequence[float] | Tensor | None = None
) -> float | Tensor:
    """Undiscounted tree return of one joint action: ``R = r + mean_j' R_child(j')``; ``R = r`` at a leaf.

    Args:
        reward: the joint action's immediate reward r (a float or a scalar tensor).
        child_returns: the B returns of the child node this joint action leads to; None or empty for
            a leaf (last turn or early termination).

    Returns:
        The return, a float for float inputs, a tensor if either input is a tensor.
    """
    if child_returns is None or len(child_returns) == 0:
        return reward
    if isinstance(child_returns, Tensor):
        return reward + child_returns.mean()
    return reward + sum(child_returns) / len(child_returns)


# --------------------------------------------------------------------------------------------------
# Actor-critic (docs/multiturn.md §4.3-4.4)
# --------------------------------------------------------------------------------------------------


def td_targets(
    rewards: Tensor, next_values: Tensor, discount: float, terminal: Tensor | None = None
) -> Tensor:
    """One-step TD targets of a trajectory: ``y_t = r̃_t + γ · V_old(h_{t+1}) · (1 − terminal_t)``.

    There is no bootstrap after the final turn, whether the episode reached the horizon or ended by
    early termination: the last position along the time dimension is always treated as terminal, and
    ``terminal`` can mark earlier ends (e.g. in padded batches). The formula is the same for both
    critic types: with ``critic_type="v"`` pass V_old(h_{t+1}); with ``"q"`` pass Q_old(h_{t+1}, a_{t+1})
    (a SARSA-style target). Values come from rollout time, so the result carries no gradient.

    Args:
        rewards: ``[..., T]`` shaped rewards r̃_t (reward − β·KL when the reference KL is on).
        next_values: ``[..., T]``; entry t is the critic value recorded at turn t+1. Entries at
            terminal positions are ignored (they may be anything finite or not).
        discount: γ (``discount``).
        terminal: optional bool ``[..., T]``, True where the episode ends after turn t.

    Returns:
        ``[..., T]`` detached targets.
    """
    _check_same_shape(rewards, next_values, "rewards and next_values")
    if rewards.ndim == 0 or rewards.shape[-1] == 0:
        raise ValueError(f"rewards must have a non-empty time dimension, got shape {tuple(rewards.shape)}.")
    no_bootstrap = torch.zeros(rewards.shape, dtype=torch.bool, device=rewards.device)
    no_bootstrap[..., -1] = True
    if terminal is not None:
        _check_same_shape(rewards, terminal, "rewards and terminal")
        no_bootstrap |= terminal.to(device=rewards.device, dtype=torch.bool)
    bootstrap = torch.where(no_bootstrap, torch.zeros_like(next_values), next_values)
    return (rewards + discount * bootstrap).detach()


def reward_to_go(rewards: Tensor) -> Tensor:
    """Undiscounted reward-to-go along the last dimension: ``G_t = Σ_{u ≥ t} r̃_u``.

    The actor-critic modules log it as ``expected_return``; γ only enters the TD target.

    Args:
        rewards: ``[..., T]`` shaped rewards.

    Returns:
        ``[..., T]`` detached returns.
    """
    return torch.flip(torch.cumsum(torch.flip(rewards.detach(), [-1]), -1), [-1])


def td_advantages(
    targets: Tensor, values: Tensor, normalize: bool = False, eps: float = ADVANTAGE_EPS
) -> Tensor:
    """Actor-critic advantages ``A = y − V_old``, optionally z-normalised over all given samples.

    The normalisation group is every sample of one agent and one turn in a drain (docs/multiturn.md §4.4),
    so pass exactly that group when ``normalize`` is set (``advantage_normalization``); a group of
    one sample is left unnormalised.

    Args:
        targets: ``[batch]`` TD targets (or shaped rewards in single-turn).
        values: ``[batch]`` rollout-time critic values V_old (or Q_old).

    Returns:
        ``[batch]`` detached advantages.
    """
    _check_same_shape(targets, values, "targets and values")
    adv = (targets - values).detach()
    return normalize_advantages(adv, eps) if normalize else adv


def value_loss(
    values: Tensor,
    targets: Tensor,
    old_values: Tensor | None = None,
    clip_range: float | None = None,
    coef: float = 1.0,
) -> Tensor:
    """Per-sample critic loss ``coef · (y − V)²``, optionally PPO-style value-clipped.

    With ``clip_range`` ε (``value_clip_range``; upstream applies it only to IAC value heads attached to
    the actor): ``coef · max((y − V)², (y − V_clip)²)`` with ``V_clip = V_old + clip(V − V_old, −ε, ε)``.
    The trainer's critic loss is ``value_loss(...).mean()``; with ``coef = value_loss_coef`` that is
    the spec's ``value_loss_coef · mean(...)`` (docs/multiturn.md §4.4).

    Args:
        values: ``[batch]`` current critic values V, with grad.
        targets: ``[batch]`` targets y (detached).
        old_values: ``[batch]`` rollout-time values V_old; required when ``clip_range`` is set.
        clip_range: ε > 0, or None for no clipping.
        coef: multiplier (``value_loss_coef``), 1.0 by default.

    Returns:
        ``[batch]`` per-sample loss.
    """
    _check_same_shape(values, targets, "values and targets")
    targets = targets.detach()
    loss = (targets - values).pow(2)
    if clip_range is not None:
        if not clip_range > 0:
            raise ValueError(f"value_clip_range must be > 0 or null, got {clip_range!r}.")
        if old_values is None:
            raise ValueError(
                "value_clip_range is set, so value_loss needs old_values (the rollout-time values)."
            )
        _check_same_shape(values, old_values, "values and old_values")
        old = old_values.detach()
        clipped = old + (values - old).clamp(-clip_range, clip_range)
        loss = torch.maximum(loss, (targets - clipped).pow(2))
    return coef * loss


# --------------------------------------------------------------------------------------------------
# Policy gradient and reference KL (docs/multiturn.md §2.8, §9; docs/preference.md §8.6)
# --------------------------------------------------------------------------------------------------


def _check_token_inputs(a: Tensor, b: Tensor, mask: Tensor, names: str) -> Tensor:
    if a.shape != b.shape or a.shape != mask.shape:
        raise ValueError(
            f"{names} and mask must have the same shape [batch, tokens], got {tuple(a.shape)}, "
            f"{tuple(b.shape)} and {tuple(mask.shape)}."
        )
    return mask.to(device=a.device, dtype=torch.bool)


def k3_kl(logps: Tensor, ref_logps: Tensor, mask: Tensor) -> Tensor:
    """Schulman's k3 estimate of KL(π ‖ π_ref), summed over each sequence's completion tokens.

    Per token, with δ_t = log π_ref(y_t) − log π(y_t): ``kl_t = exp(δ_t) − δ_t − 1`` (≥ 0, 0 iff
    δ_t = 0). Sequence KL = ``Σ_t mask_t · kl_t``, a sum, not a mean (docs/multiturn.md §9). Computed as
    ``expm1(δ) − δ`` so small δ never rounds below zero; masked positions contribute exactly 0 even
    if they hold garbage (inf/NaN) log-probs.

    Args:
        logps: ``[batch, T]`` policy log-probs of the sampled tokens.
        ref_logps: ``[batch, T]`` reference log-probs of the same tokens.
        mask: ``[batch, T]`` bool/0-1, True on the first ``response_len`` completion tokens (EOS and
            padding excluded per the spec's ``response_len``).

    Returns:
        ``[batch]`` sequence KLs (differentiable w.r.t. ``logps``; callers run it under no_grad).
    """
    m = _check_token_inputs(logps, ref_logps, mask, "logps and ref_logps")
    delta = torch.where(m, ref_logps - logps, torch.zeros_like(logps))
    per_token = (torch.expm1(delta) - delta).clamp_min(0.0)
    return per_token.sum(dim=-1)


def policy_gradient_loss(token_logps: Tensor, mask: Tensor, advantages: Tensor) -> Tensor:
    """REINFORCE loss of one node group (or one actor-critic minibatch) of one agent.

    ``L = (1/K') Σ_k −Â_k · Σ_t mask_kt · log π(y_kt | x, y_k,<t)`` (docs/multiturn.md §2.8): the **sum**
    of token log-probs per sequence (no length normalisation), the **mean** over the K' sequences that
    have at least one scored token (empty completions are skipped). ``mask`` excludes padding after
    EOS (docs/decisions.md, decision 4). The same formula is the actor-critic actor loss, a mean over the minibatch of
    −Â · log π(response) (docs/multiturn.md §4.4). Advantages are treated as constants.

    Args:
        token_logps: ``[K, T]`` log-probs of the completion tokens, with grad.
        mask: ``[K, T]`` bool/0-1, True on scored tokens.
        advantages: ``[K]``.

    Returns:
        Scalar loss; an exact 0 (still attached to the graph) when no sequence has a scored token.
    """
    m = _check_token_inputs(token_logps, token_logps, mask, "token_logps")
    if advantages.shape != token_logps.shape[:1]:
        raise ValueError(
            f"advantages must have shape [K] = {tuple(token_logps.shape[:1])}, got {tuple(advantages.shape)}."
        )
    seq_logps = torch.where(m, token_logps, torch.zeros_like(token_logps)).sum(dim=-1)  # [K]
    non_empty = m.any(dim=-1)
    per_seq = -advantages.detach().to(seq_logps.dtype) * seq_logps
    per_seq = torch.where(non_empty, per_seq, torch.zeros_like(per_seq))
    return per_seq.sum() / non_empty.sum().clamp_min(1)
