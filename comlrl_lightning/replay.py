"""Replay buffer of the iterative preference trainers (docs/preference.md §3.7, §4; docs/decisions.md, decision 6).

Every round writes ``iteration_{I:04d}.json`` (I 1-based). A round with at least one pair becomes a
*shard*; empty rounds are written but are not shards, so they neither get draws nor age older data.
Each round then trains on either the new pairs (mode ``current``) or on ``S`` pairs replayed from the
shards:

1. per-shard weights, oldest first (:func:`shard_weights`);
2. ``S`` independent categorical draws by weight give a count per shard (:func:`allocate_draws`);
3. each shard with a count is loaded and sampled without replacement, cycling through fresh full
   permutations when it is drawn more often than it has pairs (:func:`sample_from_shard`);
4. the combined sample is shuffled once more.

The functions are pure given an RNG: a ``random.Random`` (what :class:`ReplayStore` owns, so that
its state can go into a checkpoint as plain ints) or a CPU ``torch.Generator``. Pairs are plain
JSON dicts (the pair record of docs/preference.md §3.7); converting them to tensors is the caller's job.

The files, the shard index and the RNG are :class:`~comlrl_lightning.replay_store.ReplayStore`'s
(``replay_store.py``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from comlrl_lightning.config.checks import is_int

__all__ = [
    "REPLAY_MODES",
    "allocate_draws",
    "gather_draws",
    "lambda_decay_weights",
    "replay_sample_size",
    "rng_from_plain",
    "rng_state_to_plain",
    "sample_from_shard",
    "select_replay",
    "shard_weights",
]

REPLAY_MODES = ("current", "nearest_k", "all_history", "lambda_decay")

Rng = random.Random | torch.Generator


# --------------------------------------------------------------------------------------------------
# weights and sample size
# --------------------------------------------------------------------------------------------------


def lambda_decay_weights(num_rounds: int, lam: float) -> list[float]:
    """Lambda-decay weights of ``num_rounds`` shards, oldest first (docs/preference.md §4.2).

    With age ``a = 0`` for the newest shard up to ``K - 1`` for the oldest (``K = num_rounds``,
    counted in non-empty rounds, i.e. shards)::

        w(a) = (1 - λ) λ^a / Σ_{b=0}^{K-1} (1 - λ) λ^b = λ^a / Σ_{b=0}^{K-1} λ^b

    The simplified form needs no special cases: λ = 1 gives the uniform 1/K, λ = 0 gives weight 1
    to the newest shard (0^0 = 1) and 0 elsewhere. The normaliser is ≥ 1 (its a = 0 term), so it
    never vanishes. The weights sum to 1.

    Example: K = 4, λ = 0.5 → [0.0667, 0.1333, 0.2667, 0.5333].
    """
    if not is_int(num_rounds) or num_rounds < 1:
        raise ValueError(
            f"lambda_decay_weights needs num_rounds >= 1 (the number of shards), got {num_rounds!r}."
        )
    if isinstance(lam, bool) or not isinstance(lam, int | float) or not 0.0 <= lam <= 1.0:
        raise ValueError(f"preference_replay_lambda must be in [0, 1], got {lam!r}.")
    lam = float(lam)
    raw = [lam ** (num_rounds - 1 - i) for i in range(num_rounds)]  # index i = oldest..newest
    total = math.fsum(raw)
    return [w / total for w in raw]


def shard_weights(mode: str, num_shards: int, k: int | None = None, lam: float | None = None) -> list[float]:
    """Sampling weight of every shard, oldest first, one entry per shard (docs/preference.md §4.3).

    * ``nearest_k``: 1.0 for the last ``k`` shards (non-empty rounds), 0.0 for older ones; with
      ``k >= num_shards`` every shard gets 1.0. The list always has ``num_shards`` entries so that
      index ``i`` is shard ``i``; :func:`allocate_draws` never gives a draw to a 0.0 entry.
    * ``all_history``: 1.0 per shard.
    * ``lambda_decay``: :func:`lambda_decay_weights` ``(num_shards, lam)``.

    Weights are per shard, not per pair: a 2-pair shard gets as many draws on average as a
    500-pair one. ``num_shards == 0`` gives ``[]``. Mode ``current`` does not sample and has no
    weights (``ValueError``).
    """
    if not is_int(num_shards) or num_shards < 0:
        raise ValueError(f"num_shards must be an int >= 0, got {num_shards!r}.")
    if mode not in REPLAY_MODES:
        raise ValueError(f"preference_replay_mode must be one of: {', '.join(REPLAY_MODES)}; got {mode!r}.")
    if mode == "current":
        raise ValueError(
            "preference_replay_mode='current' trains on the new pairs only and has no shard weights; "
            "call shard_weights only for nearest_k, all_history or lambda_decay."
        )
    if k is not None and mode != "nearest_k":
        raise ValueError(
            f"preference_replay_k is only valid when preference_replay_mode='nearest_k' (got k={k!r})."
        )
    if lam is not None and mode != "lambda_decay":
        raise ValueError(
            f"preference_replay_lambda is only valid when preference_replay_mode='lambda_decay' (got {lam!r})."
        )
    if mode == "nearest_k":
        if k is None:
            raise ValueError("preference_replay_k is required when preference_replay_mode='nearest_k'.")
        if not is_int(k) or k < 1:
            raise ValueError(f"preference_replay_k must be an int >= 1, got {k!r}.")
        eligible = min(k, num_shards)
        return [0.0] * (num_shards - eligible) + [1.0] * eligible
    if mode == "all_history":
        return [1.0] * num_shards
    if lam is None:
        raise ValueError("preference_replay_lambda is required when preference_replay_mode='lambda_decay'.")
    return lambda_decay_weights(num_shards, lam) if num_shards else []


def replay_sample_size(configured: int | None, num_new_pairs: int, shard_sizes: Sequence[int]) -> int:
    """Number of pairs S a replay round trains on (docs/preference.md §4.1 step 3).

    S = ``configured`` (``preference_replay_sample_size``) if set; else ``num_new_pairs`` if > 0;
    else the ``num_pairs`` of the most recent non-empty shard (``shard_sizes`` oldest first); else 0.
    So a round that generated nothing still replays S pairs in the non-current modes.
    """
    if configured is not None:
        if not is_int(configured) or configured < 1:
            raise ValueError(f"preference_replay_sample_size must be >= 1 or null, got {configured!r}.")
        return configured
    if num_new_pairs > 0:
        return int(num_new_pairs)
    for size in reversed(shard_sizes):
        if size > 0:
            return int(size)
    return 0


# --------------------------------------------------------------------------------------------------
# draws
# --------------------------------------------------------------------------------------------------


def _check_rng(rng: Any) -> None:
    if isinstance(rng, torch.Generator):
        if rng.device.type != "cpu":
            raise ValueError(f"replay sampling needs a CPU torch.Generator, got one on {rng.device}.")
    elif not isinstance(rng, random.Random):
        raise TypeError(f"rng must be a random.Random or a CPU torch.Generator, got {type(rng).__name__}.")


def _permutation(n: int, rng: Rng) -> list[int]:
    """A uniformly random permutation of range(n)."""
    if isinstance(rng, torch.Generator):
        return torch.randperm(n, generator=rng).tolist()
    order = list(range(n))
    rng.shuffle(order)
    return order


def _sample_indices(n: int, count: int, rng: Rng) -> list[int]:
    """``count`` distinct indices of range(n), uniformly without replacement, in random order."""
    if isinstance(rng, torch.Generator):
        return torch.randperm(n, generator=rng)[:count].tolist()
    return rng.sample(range(n), count)


def allocate_draws(weights: Sequence[float], sample_size: int, rng: Rng) -> list[int]:
    """Split ``sample_size`` draws over shards: a multinomial allocation (docs/preference.md §4.3).

    ``counts[i] = #{t < S : X_t = i}`` with ``X_1..X_S`` independent and
    ``P(X = i) = w_i / Σ_j w_j``. There is no rounding or apportionment, so the counts vary with
    the RNG; they always sum to S, and a shard with weight 0 never gets a draw. Weights need not be
    normalised. ``S <= 0`` or no shards gives all zeros. Deterministic given the RNG state
    (``random.Random``: ``choices``; ``torch.Generator``: ``torch.multinomial``).
    """
    _check_rng(rng)
    weights = [float(w) for w in weights]
    counts = [0] * len(weights)
    if sample_size <= 0 or not weights:
        return counts
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"shard weights must be finite and >= 0, got {weights}.")
    # Only positive weights take part, which makes "no draw for a zero weight" exact (random.choices
    # clamps to the last index on float round-off).
    eligible = [i for i, w in enumerate(weights) if w > 0]
    if not eligible:
        raise ValueError(f"cannot draw {sample_size} pairs: every shard weight is 0 ({weights}).")
    eligible_w = [weights[i] for i in eligible]
    if isinstance(rng, torch.Generator):
        probs = torch.tensor(eligible_w, dtype=torch.float64)
        picks = torch.multinomial(probs, sample_size, replacement=True, generator=rng).tolist()
    else:
        picks = rng.choices(range(len(eligible)), weights=eligible_w, k=sample_size)
    for p in picks:
        counts[eligible[p]] += 1
    return counts


def sample_from_shard(records: Sequence[Any], count: int, rng: Rng) -> list[Any]:
    """Draw ``count`` records from one shard of ``R = len(records)`` (docs/preference.md §4.4).

    * ``count <= R``: a uniform sample without replacement.
    * ``count > R``: fresh full random permutations of all R records while at least R draws
      remain, then a sample without replacement of the ``count mod R`` left. Each record appears
      ⌊count/R⌋ or ⌊count/R⌋ + 1 times, each full block being an independent shuffle.

    Returns the record objects themselves (not copies).
    """
    _check_rng(rng)
    if count <= 0:
        return []
    n = len(records)
    if n == 0:
        raise ValueError(f"cannot draw {count} records from an empty shard.")
    out: list[Any] = []
    while count - len(out) >= n and count > n:
        out.extend(records[i] for i in _permutation(n, rng))
    rest = count - len(out)
    if rest:
        out.extend(records[i] for i in _sample_indices(n, rest, rng))
    return out


def gather_draws(counts: Sequence[int], load: Callable[[int], Sequence[Any]], rng: Rng) -> list[Any]:
    """Sample ``counts[i]`` records from shard i (loaded only when drawn), then shuffle it all."""
    out: list[Any] = []
    for i, c in enumerate(counts):
        if c > 0:
            out.extend(sample_from_shard(load(i), c, rng))
    return [out[i] for i in _permutation(len(out), rng)]


def select_replay(
    shards: Sequence[Sequence[Any]], weights: Sequence[float], sample_size: int, rng: Rng
) -> list[Any]:
    """One round's replayed pairs from in-memory shards (oldest first): allocate, sample, shuffle.

    :func:`allocate_draws` ``(weights, sample_size)`` gives a count per shard,
    :func:`sample_from_shard` draws it, and the concatenation is shuffled once more. The result has
    ``max(sample_size, 0)`` records (0 when there are no shards).
    """
    if len(shards) != len(weights):
        raise ValueError(f"got {len(shards)} shards but {len(weights)} weights.")
    counts = allocate_draws(weights, sample_size, rng)
    return gather_draws(counts, lambda i: shards[i], rng)


# --------------------------------------------------------------------------------------------------
# RNG state as plain types (checkpoints are loaded with weights_only=True)
# --------------------------------------------------------------------------------------------------


def rng_state_to_plain(rng: random.Random) -> dict[str, Any]:
    """``rng.getstate()`` as ``{"version": int, "internal": list[int], "gauss_next": float | None}``."""
    if not isinstance(rng, random.Random):
        raise TypeError(f"rng_state_to_plain needs a random.Random, got {type(rng).__name__}.")
    version, internal, gauss_next = rng.getstate()
    return {"version": int(version), "internal": [int(x) for x in internal], "gauss_next": gauss_next}


def rng_from_plain(state: dict[str, Any]) -> random.Random:
    """A ``random.Random`` in the state saved by :func:`rng_state_to_plain`."""
    try:
        rng = random.Random()
        rng.setstate((state["version"], tuple(state["internal"]), state["gauss_next"]))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"not a saved random.Random state ({err}); expected the dict of rng_state_to_plain."
        ) from err
    return rng
