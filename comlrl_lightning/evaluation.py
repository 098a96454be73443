"""Task-reward evaluation of a team: the single-turn sampler and the per-turn summary every module shares.

Modules implement ``evaluate(items, task, seed, samples_per_item)`` (the ``TeamModule`` protocol of
:mod:`comlrl_lightning.protocols`) with these; the ``TaskRewardEvaluation`` callback decides when to call it
and logs the result. Evaluation always scores with the task's own oracle, never a learned reward.
"""

from __future__ import annotations

from typing import Any

from comlrl_lightning.data.tasks import format_prompts
from comlrl_lightning.generation import SamplingStream
from comlrl_lightning.preferences import sample_team


def evaluate_team(team, items, formatters, oracle, settings, stream_seed: int, num_samples: int = 1) -> dict:
    """Mean task reward of ``num_samples`` sampled joint responses per item (fresh, seeded streams: agent i
    samples from ``stream_seed + 7919 * i``, so every evaluation of a run sees the same randomness)."""
    if not items:
        return {}
    prompts = format_prompts(items, formatters)
    streams = [SamplingStream(stream_seed + 7919 * i) for i in range(team.num_agents)]
    samples = sample_team(team, prompts, num_samples, settings, streams)
    rewards, lengths = [], [[] for _ in range(team.num_agents)]
    for k, item in enumerate(items):
        for j in range(num_samples):
            texts = [samples[a].texts[k][j] for a in range(team.num_agents)]
            for a, t in enumerate(texts):
                lengths[a].append(len(t))
            processed, _ = oracle.score([p[k] for p in prompts], texts, item, f"eval {k}")
            rewards.append(processed)
    mean = sum(rewards) / len(rewards)
    out = {"eval/reward_mean": mean, "eval/turn_1/reward_mean": mean, "eval/turn_1/expected_return": mean}
    for a in range(team.num_agents):
        out[f"eval/agent{a}/completions/mean_length"] = sum(lengths[a]) / len(lengths[a])
    return out


def with_turn_mean(metrics: dict[str, Any], num_turns: int) -> dict[str, Any]:
    """``metrics`` plus ``eval/reward_mean`` = the mean of ``eval/turn_{t}/reward_mean`` over the turns present
    (a multi-turn evaluation's headline number: the mean immediate reward over all turns)."""
    per_turn = [metrics[f"eval/turn_{t}/reward_mean"] for t in range(1, num_turns + 1)
                if f"eval/turn_{t}/reward_mean" in metrics]
    out = dict(metrics)
    if per_turn:
        out["eval/reward_mean"] = sum(per_turn) / len(per_turn)
    return out
