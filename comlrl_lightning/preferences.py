"""Candidates → joint responses → preference pairs, and the pair record.

Joint response j is candidate j of every agent ("aligned"). Offline pairs compare two joint responses of
the current policy (every ordered pair with a strictly positive reward gap); iterative pairs compare the
current policy's candidate j with the comparator's candidate j. Ties are never kept.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

PAIR_FIELDS = (
    "prompts", "winner_completions", "loser_completions", "winner_reward", "loser_reward",
    "candidate_reward_mean", "raw_rewards", "target_raw_reward", "comparator_raw_reward",
)


@dataclass
class PreferencePair:
    """One preference between two joint responses (one text per agent on each side).

    ``winner_token_ids`` / ``loser_token_ids`` / ``prompt_token_ids`` optionally keep the generated ids
    (offline MADPO scores the generated rows); they are not part of the JSON record, which is text only.
    """

    prompts: list[str]
    winner_completions: list[str]
    loser_completions: list[str]
    winner_reward: float
    loser_reward: float
    candidate_reward_mean: float
    raw_rewards: list[float] = field(default_factory=list)
    target_raw_reward: float | None = None
    comparator_raw_reward: float | None = None
    prompt_token_ids: list[list[int]] | None = None
    winner_token_ids: list[list[int]] | None = None
    loser_token_ids: list[list[int]] | None = None

    def to_json(self) -> dict[str, Any]:
        """The record of docs/preference.md §3.7: every key present, plain JSON types."""
        return {
            "prompts": list(self.prompts),
            "winner_completions": list(self.winner_completions),
            "loser_completions": list(self.loser_completions),
            "winner_reward": float(self.winner_reward),
            "loser_reward": float(self.loser_reward),
            "candidate_reward_mean": float(self.candidate_reward_mean),
            "raw_rewards": [float(x) for x in self.raw_rewards],
            "target_raw_reward": None if self.target_raw_reward is None else float(self.target_raw_reward),
            "comparator_raw_reward": (
                None if self.comparator_raw_reward is None else float(self.comparator_raw_reward)
            ),
        }

    @classmethod
    def from_json(cls, record: dict[str, Any], num_agents: int | None = None) -> PreferencePair:
        """Rebuild a pair from its record (docs/preference.md §3.7); text lists are cut or padded with "" to
        ``num_agents``.

        ``prompts``, ``winner_completions`` and ``loser_completions`` must be present as non-empty lists of
        strings, and every reward present must be a finite number; anything else raises ``ValueError`` naming
        the field (a damaged record never trains as empty text). Missing reward fields read 0.0 / None / [].
        """
        if not isinstance(record, dict):
            raise ValueError(f"a preference pair record must be a dict; got {type(record).__name__}.")

        def texts(key: str) -> list[str]:
            values = record.get(key)
            if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
                got = "missing" if key not in record else repr(values)[:80]
                raise ValueError(f"preference pair record: {key!r} must be a non-empty list of strings; got {got}.")
            if num_agents is not None:
                values = (values + [""] * num_agents)[:num_agents]
            return list(values)

        def number(key: str, value: Any) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"preference pair record: {key!r} must be a finite number; got {value!r}.")
            return float(value)

        def opt(key: str) -> float | None:
            v = record.get(key)
            return None if v is None else number(key, v)

        raw = record.get("raw_rewards") or []
        if not isinstance(raw, list):
            raise ValueError(f"preference pair record: 'raw_rewards' must be a list; got {raw!r}.")
        return cls(
            prompts=texts("prompts"),
            winner_completions=texts("winner_completions"),
            loser_completions=texts("loser_completions"),
            winner_reward=opt("winner_reward") or 0.0,
            loser_reward=opt("loser_reward") or 0.0,
            candidate_reward_mean=opt("candidate_reward_mean") or 0.0,
            raw_rewards=[number("raw_rewards", x) for x in raw],
            target_raw_reward=opt("target_raw_reward"),
            comparator_raw_reward=opt("comparator_raw_reward"),
        )


def select_offline_pairs(
    rewards: Sequence[float], pair_selection: str, limit: int | None, rng: random.Random | None = None
) -> list[tuple[int, int]]:
    """Pairs (winner, loser) of candidate indices for one item (docs/preference.md §3.4).

    Candidates: every ordered (i, j) with r_i - r_j > 0. ``reward_gap``: stable sort by gap descending
    (ties keep i, then j ascending), first ``limit``. ``random``: shuffled with ``rng``, first ``limit``.
    ``all``: sorted by (i, j), no limit.
    """
    cands = [(rewards[i] - rewards[j], i, j) for i in range(len(rewards)) for j in range(len(rewards))
             if i != j and rewards[i] - rewards[j] > 0]
    if pair_selection == "reward_gap":
        cands.sort(key=lambda c: -c[0])
    elif pair_selection == "random":
        (rng or random).shuffle(cands)
    elif pair_selection == "all":
        cands.sort(key=lambda c: (c[1], c[2]))
        return [(i, j) for _, i, j in cands]
    else:
        raise ValueError(f"pair_selection must be one of: reward_gap, all, random. Got {pair_selection!r}.")
    if limit is not None:
        cands = cands[:limit]
    return [(i, j) for _, i, j in cands]


def select_iterative_pairs(
    current: Sequence[float], comparator: Sequence[float], pair_selection: str, limit: int | None,
    rng: random.Random | None = None,
) -> list[tuple[int, str]]:
    """Index-aligned current-vs-comparator comparisons for one item (docs/preference.md §3.5).

    For j < min(N, M), compare c_j with p_j; equal values are skipped; the higher side wins. Returns
    (j, winner) with winner in {"current", "comparator"}. ``comparator_reward``: sort descending by
    (p_j, |gap|); ``reward_gap``: by |gap| descending; ``random``: shuffled; ``all``: by j. Stable sorts;
    all but ``all`` truncate to ``limit``.
    """
    recs = []
    for j in range(min(len(current), len(comparator))):
        gap = current[j] - comparator[j]
        if gap == 0:
            continue
        recs.append((abs(gap), comparator[j], j, "current" if gap > 0 else "comparator"))
    if pair_selection == "comparator_reward":
        recs.sort(key=lambda r: (-r[1], -r[0]))
    elif pair_selection == "reward_gap":
        recs.sort(key=lambda r: -r[0])
    elif pair_selection == "random":
        (rng or random).shuffle(recs)
    elif pair_selection == "all":
        return [(j, w) for _, _, j, w in sorted(recs, key=lambda r: r[2])]
    else:
        raise ValueError(
            f"pair_selection must be one of: reward_gap, all, random, comparator_reward. Got {pair_selection!r}."
        )
    if limit is not None:
        recs = recs[:limit]
    return [(j, w) for _, _, j, w in recs]


@dataclass
class CollectionStats:
    """What one collection pass saw: items, joint responses, pairs, and the mean candidate reward."""

    num_items: int = 0
    num_candidates: int = 0
    num_pairs: int = 0
    num_ties: int = 0
    reward_sum: float = 0.0
    wins: int = 0
    comparisons: int = 0
    target_raw_rewards: list = field(default_factory=list)
    comparator_raw_rewards: list = field(default_factory=list)

    @property
    def reward_mean(self) -> float:
        return self.reward_sum / self.num_candidates if self.num_candidates else 0.0

    def add(self, other: CollectionStats) -> None:
        """Accumulate another pass (e.g. the next chunk of items) into this one: counts and sums add up,
        reward lists are concatenated."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def build_offline_pairs(
    items: Sequence[dict],
    prompts: Sequence[Sequence[str]],
    samples: Sequence[Any],
    score: Callable[[Sequence[str], Sequence[str], dict, int], tuple[float, float]],
    pair_selection: str,
    limit: int | None,
    rng: random.Random,
    item_offset: int = 0,
) -> tuple[list[PreferencePair], CollectionStats]:
    """Score aligned joint responses and build the offline pairs of each item.

    ``prompts[a][k]`` is agent a's prompt for item k; ``samples[a]`` is agent a's
    :class:`~comlrl_lightning.generation.Samples` over the same items. ``score(prompts, texts, item,
    index)`` returns (processed, raw) for one joint response.
    """
    pairs: list[PreferencePair] = []
    stats = CollectionStats()
    num_agents = len(samples)
    for k, item in enumerate(items):
        agent_prompts = [prompts[a][k] for a in range(num_agents)]
        n = min(len(samples[a].texts[k]) for a in range(num_agents))
        rewards = []
        for j in range(n):
            processed, _ = score(agent_prompts, [samples[a].texts[k][j] for a in range(num_agents)], item,
                                 item_offset + k)
            rewards.append(processed)
        stats.num_items += 1
        stats.num_candidates += n
        stats.reward_sum += sum(rewards)
        mean = sum(rewards) / n if n else 0.0
        chosen = select_offline_pairs(rewards, pair_selection, limit, rng)
        stats.num_pairs += len(chosen)
        for w, lo in chosen:
            pairs.append(PreferencePair(
                prompts=agent_prompts,
                winner_completions=[samples[a].texts[k][w] for a in range(num_agents)],
                loser_completions=[samples[a].texts[k][lo] for a in range(num_agents)],
                winner_reward=rewards[w],
                loser_reward=rewards[lo],
                candidate_reward_mean=mean,
                prompt_token_ids=[samples[a].prompt_ids[k] for a in range(num_agents)],
                winner_token_ids=[samples[a].completion_ids[k][w] for a in range(num_agents)],
                loser_token_ids=[samples[a].completion_ids[k][lo] for a in range(num_agents)],
            ))
    return pairs, stats


def sample_team(team: Any, prompts: Sequence[Sequence[str]], num_candidates: int, settings: Any,
                streams: Sequence[Any]) -> list[Any]:
    """Sample ``num_candidates`` completions per agent per prompt through the team's engine
    (:func:`~comlrl_lightning.engines.engine_of`): one request per agent, served together where the engine can."""
    from comlrl_lightning.engines import SampleRequest, engine_of

    engine = engine_of(team)
    requests = [SampleRequest(a, prompts[a], num_candidates, streams[a]) for a in range(team.num_agents)]
    return engine.sample_many(requests, settings)


def collect_offline_pairs(
    team: Any,
    items: Sequence[dict],
    formatters: Sequence[Callable[[dict], str]],
    oracle: Any,
    settings: Any,
    num_candidates: int,
    pair_selection: str,
    limit: int | None,
    rng: random.Random,
    streams: Sequence[Any],
    chunk_size: int = 16,
    progress: bool = True,
    item_offset: int = 0,
) -> tuple[list[PreferencePair], CollectionStats]:
    """One pass over ``items``: sample, score aligned joint responses, select pairs (docs/preference.md §3.1–3.4).

    Items are processed in chunks of ``chunk_size`` (one batched ``generate`` per agent per chunk), in
    dataset order, so the pair order is dataset order then selection order. ``item_offset`` is the dataset
    index of ``items[0]`` (a rank's shard starts there, docs/scaling.md, section 1); the oracle sees dataset indices.
    """
    from comlrl_lightning.data.sources import format_prompts

    pairs: list[PreferencePair] = []
    total = CollectionStats()
    starts = range(0, len(items), chunk_size)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(items), desc="collecting preferences", unit="item", leave=False)
    try:
        for start in starts:
            chunk = list(items[start:start + chunk_size])
            prompts = format_prompts(chunk, formatters, offset=item_offset + start)
            samples = sample_team(team, prompts, num_candidates, settings, streams)
            new, stats = build_offline_pairs(chunk, prompts, samples, oracle.score, pair_selection, limit, rng,
                                             item_offset=item_offset + start)
            pairs.extend(new)
            total.add(stats)
            if bar is not None:
                bar.update(len(chunk))
                bar.set_postfix(pairs=total.num_pairs, reward=f"{total.reward_mean:.3f}")
    finally:
        if bar is not None:
            bar.close()
    return pairs, total


def collect_offline_split(
    team: Any,
    items: Sequence[dict],
    formatters: Sequence[Callable[[dict], str]],
    oracle: Any,
    settings: Any,
    num_candidates: int,
    pair_selection: str,
    limit: int | None,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    chunk_size: int = 16,
    progress: bool = True,
    where: str = "the offline collection",
) -> tuple[list[PreferencePair], CollectionStats, CollectionStats, list[list[int]]]:
    """:func:`collect_offline_pairs` split across ``world_size`` ranks (docs/scaling.md): this rank collects its
    block ``shard_bounds(len(items), rank, world_size)`` with agent i's stream seeded ``s + 1000 * i`` and pair
    selection seeded ``s``, ``s = rank_seed(seed, rank)``; the blocks are gathered in rank order (a collective:
    every rank calls it, empty blocks included). An exception on one rank stops every rank with a
    ``RankFailure`` naming the rank and ``where`` (:func:`~comlrl_lightning.distributed.gather_round`).

    Returns (global pairs in dataset order, global stats, this rank's stats, ``[start, end, num_pairs]`` per rank).
    """
    from comlrl_lightning.distributed import gather_round, rank_seed, shard_bounds
    from comlrl_lightning.generation import SamplingStream

    start, end = shard_bounds(len(items), rank, world_size)
    s = rank_seed(seed, rank)

    def shard() -> tuple:
        streams = [SamplingStream(s + 1000 * i) for i in range(team.num_agents)]
        local, local_stats = collect_offline_pairs(team, list(items[start:end]), formatters, oracle, settings,
                                                   num_candidates, pair_selection, limit, random.Random(s), streams,
                                                   chunk_size=chunk_size, progress=progress, item_offset=start)
        return start, end, local, local_stats

    shards = gather_round(shard, rank, world_size, where)
    local_stats = shards[rank][3]
    stats = CollectionStats()
    for *_, shard_stats in shards:
        stats.add(shard_stats)
    pairs = [p for _, _, shard_pairs, _ in shards for p in shard_pairs]
    return pairs, stats, local_stats, [[a, b, len(ps)] for a, b, ps, _ in shards]


def build_iterative_pairs(
    items: Sequence[dict],
    prompts: Sequence[Sequence[str]],
    current: Sequence[Any],
    comparator: Sequence[Any],
    score: Callable[[Sequence[str], Sequence[str], dict, int], tuple[float, float]],
    pair_selection: str,
    limit: int | None,
    rng: random.Random,
    item_offset: int = 0,
) -> tuple[list[PreferencePair], CollectionStats]:
    """Current-versus-comparator pairs of each item (docs/preference.md §3.5, §5.6).

    ``current[a]`` / ``comparator[a]`` hold agent a's samples (only ``.texts`` is read); candidate j of
    every agent forms joint response j on each side. A side has ``min_a len(texts)`` joint responses, so
    N and M may differ: only the first ``min(N, M)`` indices are compared, but every joint response of
    both sides enters ``candidate_reward_mean``. Pairs carry the current policy's prompts, the raw rewards
    ``[winner, loser]``, ``target_raw_reward`` (c_raw[j]) and ``comparator_raw_reward`` (p_raw[j]) and no
    token ids (they are re-tokenized from the text, docs/preference.md §7.3). The stats count wins of the current side,
    ties and comparisons over the aligned indices.
    """
    pairs: list[PreferencePair] = []
    stats = CollectionStats()
    num_agents = len(current)
    for k, item in enumerate(items):
        agent_prompts = [prompts[a][k] for a in range(num_agents)]
        sides = []
        for samples in (current, comparator):
            n = min(len(samples[a].texts[k]) for a in range(num_agents))
            texts = [[samples[a].texts[k][j] for a in range(num_agents)] for j in range(n)]
            scored = [score(agent_prompts, t, item, item_offset + k) for t in texts]
            sides.append((texts, [s[0] for s in scored], [s[1] for s in scored]))
        (c_texts, c, c_raw), (p_texts, p, p_raw) = sides
        stats.target_raw_rewards.extend(c_raw)
        stats.comparator_raw_rewards.extend(p_raw)
        every = c + p
        mean = sum(every) / len(every) if every else 0.0
        aligned = min(len(c), len(p))
        ties = sum(1 for j in range(aligned) if c[j] == p[j])
        stats.num_items += 1
        stats.num_candidates += len(every)
        stats.reward_sum += sum(every)
        stats.comparisons += aligned
        stats.num_ties += ties
        stats.wins += sum(1 for j in range(aligned) if c[j] > p[j])
        chosen = select_iterative_pairs(c, p, pair_selection, limit, rng)
        stats.num_pairs += len(chosen)
        for j, winner in chosen:
            cur = (c_texts[j], c[j], c_raw[j])
            comp = (p_texts[j], p[j], p_raw[j])
            win, lose = (cur, comp) if winner == "current" else (comp, cur)
            pairs.append(PreferencePair(
                prompts=list(agent_prompts),
                winner_completions=list(win[0]),
                loser_completions=list(lose[0]),
                winner_reward=win[1],
                loser_reward=lose[1],
                candidate_reward_mean=mean,
                raw_rewards=[win[2], lose[2]],
                target_raw_reward=c_raw[j],
                comparator_raw_reward=p_raw[j],
            ))
    return pairs, stats
