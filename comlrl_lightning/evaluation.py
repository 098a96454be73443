"""Task-reward evaluation of a team: the single-turn sampler and the per-turn summary every module shares.

Modules implement ``evaluate(items, task, seed, samples_per_item)`` (the ``TeamModule`` protocol of
:mod:`comlrl_lightning.protocols`) with these; the ``TaskRewardEvaluation`` callback decides when to call it
and logs the result. Evaluation always scores with the task's own oracle, never a learned reward.

Across ranks evaluation is replicated: every rank evaluates the same items from the same seeds (docs/scaling.md,
section 3). With sharded agents (FSDP2) its ``generate`` calls (and actor-critic critic and KL passes) are
collectives, and a task reward that differs between ranks (a sandbox timeout, a remote judge) can end an actor-critic
episode early on one rank only; :func:`balanced_evaluation` runs an evaluation as a balanced round
(:func:`~comlrl_lightning.distributed.gather_round`), so such a rank joins the others' calls instead of leaving them
waiting, and :func:`balanced_pass` makes a forward pass of sharded members one of those calls.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Sequence
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


def balanced_evaluation(module: Any, work: Callable[[], Any], where: str) -> Any:
    """``work()`` (this rank's evaluation) as a balanced round when ``module``'s team is sharded (FSDP2): a rank
    whose evaluation made fewer balanced calls (``generate`` of a sharded agent, :func:`balanced_pass`) joins the
    calls the others still make, and an exception on any rank stops every rank with a ``RankFailure`` naming the
    rank and ``where`` (:func:`~comlrl_lightning.distributed.gather_round`; only a small status travels, each rank
    keeps its own metrics). Every rank must then evaluate, as the ``TaskRewardEvaluation`` callback and ``validate``
    do. Otherwise (one process, DDP: evaluation runs no collective) ``work()`` as is."""
    from comlrl_lightning.distributed import gather_round, world
    from comlrl_lightning.sharding import team_is_sharded

    if getattr(module, "_in_balanced_evaluation", False) or not team_is_sharded(module):
        return work()
    rank, size = world(getattr(module, "_trainer", None))
    result: list[Any] = []
    module._in_balanced_evaluation = True  # an override calling its base's evaluate: one round, not two
    try:
        gather_round(lambda: result.append(work()), rank, size, where)
    finally:
        module._in_balanced_evaluation = False
    return result[0]


def balanced_pass(module: Any, name: str, members: Sequence[Any], fn: Callable[[], Any]) -> Any:
    """``fn()``, a forward pass through the sharded ``members`` (each a ``fully_shard``-ed module, e.g. an agent and
    its reference), as a balanced collective named ``name``: announced to the other ranks, then run with every
    member gathered whole (:func:`~comlrl_lightning.sharding.gathered`: one all-gather per FSDP unit, no collective
    inside), so that a rank that has finished its evaluation joins it (:func:`balanced_evaluation`). The collective
    is registered on the first call of ``name`` on ``module`` (:func:`register_passes` registers them up front:
    every rank must register the same names in the same order). Outside a balanced evaluation: ``fn()``."""
    if not getattr(module, "_in_balanced_evaluation", False):
        return fn()
    from comlrl_lightning.distributed import announce_balanced
    from comlrl_lightning.sharding import gathered

    key = register_passes(module, {name: members})[name]
    announce_balanced(key)
    with contextlib.ExitStack() as stack:
        for member in _distinct(members):
            stack.enter_context(gathered(member))
        return fn()


def register_passes(module: Any, passes: dict[str, Sequence[Any]]) -> dict[str, int]:
    """The balanced-collective keys of ``module``'s passes ``{name: members}`` (:func:`balanced_pass`), registered
    on first sight in the order given; their join gathers the members whole and frees them."""
    from comlrl_lightning.distributed import register_balanced

    keys = module.__dict__.setdefault("_balanced_pass_keys", {})
    for name, members in passes.items():
        if name not in keys:
            refs = [weakref.ref(m) for m in _distinct(members)]
            keys[name] = register_balanced(functools.partial(_join_pass, refs), name=name)
    return {name: keys[name] for name in passes}


def _distinct(members: Sequence[Any]) -> list[Any]:
    return list({id(m): m for m in members if m is not None}.values())


def _join_pass(refs: list) -> None:
    """Take part in another rank's :func:`balanced_pass` without running it: gather its members, free them."""
    from comlrl_lightning.sharding import gathered

    with contextlib.ExitStack() as stack:
        for ref in refs:
            member = ref()
            if member is None:
                raise RuntimeError("Another rank runs an evaluation pass through a sharded model this rank no longer "
                                   "holds.")
            stack.enter_context(gathered(member))
