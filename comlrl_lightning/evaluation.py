"""Task-reward evaluation of a team: the single-turn sampler and the per-turn summary every module shares.

Modules implement ``evaluate(items, task, seed, samples_per_item)`` (the ``TeamModule`` protocol of
:mod:`comlrl_lightning.protocols`) with these; the ``TaskRewardEvaluation`` callback decides when to call it
and logs the result. Evaluation always scores with the task's own oracle, never a learned reward.
"""

from __future__ import annotations

from typing import Any

from comlrl_lightning.data.sources import format_prompts
from comlrl_lightning.generation import SamplingStream
from comlrl_lightning.preferences import sample_team


class EvalMetrics(dict):
    """An evaluation's metrics (a plain dict for logging) plus what was sampled, for CoMLRL's ``eval_logger``:
    ``completions[agent][path][turn]`` (one path per item and sample), ``batch_items[path]`` and
    ``raw_prompts[path]`` (the items' raw prompt field)."""

    completions: list | None = None
    batch_items: list | None = None
    raw_prompts: list | None = None


def evaluate_team(team, items, formatters, oracle, settings, stream_seed: int, num_samples: int = 1,
                  batch_size: int | None = None) -> dict:
    """Mean task reward of ``num_samples`` sampled joint responses per item (fresh, seeded streams: agent i
    samples from ``stream_seed + 7919 * i``, so every evaluation of a run sees the same randomness).

    ``batch_size`` (``eval_batch_size``) items are generated together (None = all at once).
    ``eval/agent{i}/completions/mean_length`` counts completion tokens, as the training metric and TRL do."""
    if not items:
        return {}
    prompts = format_prompts(items, formatters)
    streams = [SamplingStream(stream_seed + 7919 * i) for i in range(team.num_agents)]
    step = batch_size or len(items)
    chunks = [sample_team(team, [p[s:s + step] for p in prompts], num_samples, settings, streams)
              for s in range(0, len(items), step)]
    texts_of = [[t for c in chunks for t in c[a].texts] for a in range(team.num_agents)]
    ids_of = [[t for c in chunks for t in c[a].completion_ids] for a in range(team.num_agents)]
    rewards, lengths = [], [[] for _ in range(team.num_agents)]
    completions = [[] for _ in range(team.num_agents)]
    paths, raw_prompts = [], []
    for k, item in enumerate(items):
        for j in range(num_samples):
            texts = [texts_of[a][k][j] for a in range(team.num_agents)]
            for a, t in enumerate(texts):
                lengths[a].append(len(ids_of[a][k][j]))
                completions[a].append([t])
            paths.append(item)
            raw_prompts.append(item.get("prompt", "") if isinstance(item, dict) else "")
            processed, _ = oracle.score([p[k] for p in prompts], texts, item, f"eval {k}")
            rewards.append(processed)
    mean = sum(rewards) / len(rewards)
    out = EvalMetrics({"eval/reward_mean": mean, "eval/turn_1/reward_mean": mean,
                       "eval/turn_1/expected_return": mean})
    for a in range(team.num_agents):
        out[f"eval/agent{a}/completions/mean_length"] = sum(lengths[a]) / len(lengths[a])
    out.completions, out.batch_items, out.raw_prompts = completions, paths, raw_prompts
    return out


def custom_eval_metrics(result: Any, eval_logger: Any, eval_aggregator: Any, num_turns: int) -> dict[str, float]:
    """CoMLRL's user-defined evaluation metrics: ``eval_logger(agent_completions_turns=..., batch_items=...,
    prompts=...)`` gives one dict per item, ``eval_aggregator(metrics, num_turns=T)`` reduces them; every key
    comes back prefixed with ``eval/``. Empty when the evaluation recorded no completions."""
    completions = getattr(result, "completions", None)
    if not completions or not all(completions):
        return {}
    per_item = eval_logger(agent_completions_turns=completions, batch_items=list(result.batch_items),
                           prompts=list(result.raw_prompts))
    reduced = eval_aggregator(per_item, num_turns=num_turns) or {}
    out = {}
    for key, value in reduced.items():
        try:
            out[f"eval/{key}"] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def with_turn_mean(metrics: dict[str, Any], num_turns: int) -> dict[str, Any]:
    """``metrics`` plus ``eval/reward_mean`` = the mean of ``eval/turn_{t}/reward_mean`` over the turns present
    (a multi-turn evaluation's headline number: the mean immediate reward over all turns)."""
    per_turn = [metrics[f"eval/turn_{t}/reward_mean"] for t in range(1, num_turns + 1)
                if f"eval/turn_{t}/reward_mean" in metrics]
    out = EvalMetrics(metrics)
    for name in ("completions", "batch_items", "raw_prompts"):
        setattr(out, name, getattr(metrics, name, None))
    if per_turn:
        out["eval/reward_mean"] = sum(per_turn) / len(per_turn)
    return out
