"""Replay buffer of the iterative preference trainers (spec §3.7, §4; README decision 6).

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
JSON dicts (the pair record of §3.7); converting them to tensors is the caller's job.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import random
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

__all__ = [
    "REPLAY_MODES",
    "ReplayShard",
    "ReplayStore",
    "allocate_draws",
    "lambda_decay_weights",
    "replay_sample_size",
    "rng_from_plain",
    "rng_state_to_plain",
    "sample_from_shard",
    "select_replay",
    "shard_weights",
]

logger = logging.getLogger("comlrl_lightning.replay")

REPLAY_MODES = ("current", "nearest_k", "all_history", "lambda_decay")

Rng = random.Random | torch.Generator

_FILE_RE = re.compile(r"^iteration_(\d{4,})\.json$")
_STATE_VERSION = 1


# --------------------------------------------------------------------------------------------------
# weights and sample size
# --------------------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def lambda_decay_weights(num_rounds: int, lam: float) -> list[float]:
    """Lambda-decay weights of ``num_rounds`` shards, oldest first (spec §4.2).

    With age ``a = 0`` for the newest shard up to ``K - 1`` for the oldest (``K = num_rounds``,
    counted in non-empty rounds, i.e. shards)::

        w(a) = (1 - λ) λ^a / Σ_{b=0}^{K-1} (1 - λ) λ^b = λ^a / Σ_{b=0}^{K-1} λ^b

    The simplified form needs no special cases: λ = 1 gives the uniform 1/K, λ = 0 gives weight 1
    to the newest shard (0^0 = 1) and 0 elsewhere. The normaliser is ≥ 1 (its a = 0 term), so it
    never vanishes. The weights sum to 1.

    Example: K = 4, λ = 0.5 → [0.0667, 0.1333, 0.2667, 0.5333].
    """
    if not _is_int(num_rounds) or num_rounds < 1:
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
    """Sampling weight of every shard, oldest first, one entry per shard (spec §4.3).

    * ``nearest_k``: 1.0 for the last ``k`` shards (non-empty rounds), 0.0 for older ones; with
      ``k >= num_shards`` every shard gets 1.0. The list always has ``num_shards`` entries so that
      index ``i`` is shard ``i``; :func:`allocate_draws` never gives a draw to a 0.0 entry.
    * ``all_history``: 1.0 per shard.
    * ``lambda_decay``: :func:`lambda_decay_weights` ``(num_shards, lam)``.

    Weights are per shard, not per pair: a 2-pair shard gets as many draws on average as a
    500-pair one. ``num_shards == 0`` gives ``[]``. Mode ``current`` does not sample and has no
    weights (``ValueError``).
    """
    if not _is_int(num_shards) or num_shards < 0:
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
        if not _is_int(k) or k < 1:
            raise ValueError(f"preference_replay_k must be an int >= 1, got {k!r}.")
        eligible = min(k, num_shards)
        return [0.0] * (num_shards - eligible) + [1.0] * eligible
    if mode == "all_history":
        return [1.0] * num_shards
    if lam is None:
        raise ValueError("preference_replay_lambda is required when preference_replay_mode='lambda_decay'.")
    return lambda_decay_weights(num_shards, lam) if num_shards else []


def replay_sample_size(configured: int | None, num_new_pairs: int, shard_sizes: Sequence[int]) -> int:
    """Number of pairs S a replay round trains on (spec §4.1 step 3).

    S = ``configured`` (``preference_replay_sample_size``) if set; else ``num_new_pairs`` if > 0;
    else the ``num_pairs`` of the most recent non-empty shard (``shard_sizes`` oldest first); else 0.
    So a round that generated nothing still replays S pairs in the non-current modes.
    """
    if configured is not None:
        if not _is_int(configured) or configured < 1:
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
    """Split ``sample_size`` draws over shards: a multinomial allocation (spec §4.3).

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
    """Draw ``count`` records from one shard of ``R = len(records)`` (spec §4.4).

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


def _gather(counts: Sequence[int], load: Callable[[int], Sequence[Any]], rng: Rng) -> list[Any]:
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
    return _gather(counts, lambda i: shards[i], rng)


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


# --------------------------------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------------------------------


class ReplayShard(NamedTuple):
    """A non-empty round on disk: 1-based ``iteration``, file ``path``, ``num_pairs`` ≥ 1."""

    iteration: int
    path: Path
    num_pairs: int


class ReplayStore:
    """Round files in ``directory``, the shard index, and the replay RNG (spec §3.7, §4).

    Per round: :meth:`write_round` for the round's pairs (every mode, empty rounds included), then
    :meth:`select` for the pairs to train on. ``state_dict`` holds the shard index and the RNG state
    as plain types, so a resumed run draws the same pairs as an uninterrupted one. Shard files are
    referenced by file name relative to ``directory``: the resumed run must point at the same
    (or a copied) directory.

    Files of an earlier run already in ``directory`` are never imported: without a loaded state the
    index starts empty, and those files get overwritten as rounds are written (logged once).
    """

    def __init__(self, directory: str | os.PathLike[str], seed: int = 0) -> None:
        self.directory = Path(directory).expanduser().absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(seed)
        self._shards: list[ReplayShard] = []
        self._state_loaded = False
        self._checked_leftovers = False

    # -- index ------------------------------------------------------------------------------------

    @property
    def shards(self) -> tuple[ReplayShard, ...]:
        """Registered shards (non-empty rounds), oldest first."""
        return tuple(self._shards)

    @property
    def total_pairs(self) -> int:
        """Sum of ``num_pairs`` over all shards (``iter/total_preference_pairs``)."""
        return sum(s.num_pairs for s in self._shards)

    def file_for(self, iteration: int) -> Path:
        """Path of round ``iteration`` (1-based): ``directory/iteration_{I:04d}.json``."""
        return self.directory / f"iteration_{iteration:04d}.json"

    def _warn_leftovers(self) -> None:
        if self._checked_leftovers or self._state_loaded:
            return
        self._checked_leftovers = True
        old = sorted(p.name for p in self.directory.iterdir() if _FILE_RE.match(p.name))
        if old:
            logger.warning(
                "Replay directory %s already holds %d iteration file(s) from an earlier run (%s..%s); "
                "they are ignored and will be overwritten. Resume from a checkpoint to reuse them.",
                self.directory,
                len(old),
                old[0],
                old[-1],
            )

    # -- files ------------------------------------------------------------------------------------

    def write_round(self, iteration: int, pairs: Sequence[dict[str, Any]]) -> Path:
        """Write round ``iteration`` (1-based) and register it as a shard if it has pairs.

        The file is compact UTF-8 JSON ``{"iteration": I, "num_pairs": n, "pairs": [...]}`` with
        non-ASCII text kept, written to a temp file in the same directory, fsynced, then renamed
        over the target (``os.replace``), so a crash never leaves a half-written round. NaN or
        infinite numbers are rejected. Rewriting an iteration that is already registered (a
        resumed run replaying a round) drops it and any later shard from the index first.
        """
        if not _is_int(iteration) or iteration < 1:
            raise ValueError(f"replay iteration numbers are 1-based ints, got {iteration!r}.")
        pairs = list(pairs)
        for j, p in enumerate(pairs):
            if not isinstance(p, dict):
                raise TypeError(
                    f"pair {j} of iteration {iteration} is a {type(p).__name__}, expected a dict."
                )
        self._warn_leftovers()
        path = self.file_for(iteration)
        payload = {"iteration": iteration, "num_pairs": len(pairs), "pairs": pairs}
        try:
            text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ValueError(f"cannot write {path}: a pair is not plain finite JSON ({err}).") from err
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._fsync_dir()

        stale = [s for s in self._shards if s.iteration >= iteration]
        if stale:
            logger.warning(
                "Replay iteration %d rewritten; dropping shards of iterations %s from the index.",
                iteration,
                [s.iteration for s in stale],
            )
            self._shards = [s for s in self._shards if s.iteration < iteration]
        if pairs:
            self._shards.append(ReplayShard(iteration, path, len(pairs)))
        return path

    def _fsync_dir(self) -> None:
        # Makes the rename itself durable on POSIX; not possible everywhere (e.g. Windows).
        try:
            fd = os.open(self.directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def load_shard(self, shard: ReplayShard) -> list[dict[str, Any]]:
        """The pair records of ``shard``, after checking the file against the index.

        Raises ``FileNotFoundError`` when the file is missing and ``ValueError`` when it is not
        valid JSON, has the wrong top level, holds a non-dict record, or its ``iteration`` /
        ``num_pairs`` disagree with the index; every message names the file.
        """
        path = Path(shard.path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise FileNotFoundError(
                f"Replay shard {path} (iteration {shard.iteration}, {shard.num_pairs} pairs) is missing. "
                "Replay files must stay in the replay directory for the whole run."
            ) from None
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"Replay shard {path} is corrupt: not valid JSON ({err}).") from err
        if not isinstance(data, dict) or set(data) != {"iteration", "num_pairs", "pairs"}:
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ValueError(
                f"Replay shard {path} is corrupt: expected an object with keys iteration, num_pairs, pairs; got {got}."
            )
        pairs = data["pairs"]
        if not isinstance(pairs, list) or not all(isinstance(p, dict) for p in pairs):
            raise ValueError(f"Replay shard {path} is corrupt: 'pairs' must be a list of objects.")
        if data["num_pairs"] != len(pairs) or len(pairs) != shard.num_pairs:
            raise ValueError(
                f"Replay shard {path} is corrupt: num_pairs={data['num_pairs']!r}, {len(pairs)} records in the "
                f"file, {shard.num_pairs} expected by the replay index."
            )
        if data["iteration"] != shard.iteration:
            raise ValueError(
                f"Replay shard {path} is corrupt: iteration={data['iteration']!r}, expected {shard.iteration}."
            )
        return pairs

    # -- selection --------------------------------------------------------------------------------

    def select(
        self,
        mode: str,
        new_pairs: Sequence[dict[str, Any]],
        sample_size: int | None = None,
        k: int | None = None,
        lam: float | None = None,
        rng: Rng | None = None,
    ) -> list[dict[str, Any]]:
        """The pairs round ``t`` trains on (spec §4.1 step 2-3); call after :meth:`write_round`.

        * ``current``: exactly ``new_pairs``, in order; no sampling, no file read, no RNG use.
        * ``nearest_k`` / ``all_history`` / ``lambda_decay``: S = :func:`replay_sample_size`
          ``(sample_size, len(new_pairs), shard sizes)`` pairs drawn from the shards (this round's
          included) with :func:`shard_weights`, :func:`allocate_draws`, :func:`sample_from_shard`
          and a final shuffle. Only shards with draws are read from disk. Even with no new pairs
          the round replays S pairs.

        ``rng`` defaults to the store's own ``random.Random`` (saved in ``state_dict``).
        """
        if mode not in REPLAY_MODES:
            raise ValueError(
                f"preference_replay_mode must be one of: {', '.join(REPLAY_MODES)}; got {mode!r}."
            )
        if mode == "current":
            if sample_size is not None:
                raise ValueError(
                    "preference_replay_sample_size is only valid when preference_replay_mode is "
                    f"'nearest_k', 'all_history', or 'lambda_decay' (got {sample_size!r} with 'current')."
                )
            return list(new_pairs)
        rng = self.rng if rng is None else rng
        weights = shard_weights(mode, len(self._shards), k=k, lam=lam)
        size = replay_sample_size(sample_size, len(new_pairs), [s.num_pairs for s in self._shards])
        counts = allocate_draws(weights, size, rng)
        return _gather(counts, lambda i: self.load_shard(self._shards[i]), rng)

    # -- checkpoint state -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Shard index and RNG state as plain lists/dicts/str/int (safe for ``weights_only`` loads)."""
        return {
            "version": _STATE_VERSION,
            "directory": str(self.directory),
            "shards": [
                {"iteration": s.iteration, "file": Path(s.path).name, "num_pairs": s.num_pairs}
                for s in self._shards
            ],
            "rng": rng_state_to_plain(self.rng),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the index and RNG of :meth:`state_dict`; shard files must exist in ``directory``."""
        try:
            version = state["version"]
            entries = [(int(e["iteration"]), str(e["file"]), int(e["num_pairs"])) for e in state["shards"]]
            rng = rng_from_plain(state["rng"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a ReplayStore state_dict ({err!r}).") from err
        if version != _STATE_VERSION:
            raise ValueError(
                f"unsupported ReplayStore state version {version!r} (expected {_STATE_VERSION})."
            )
        its = [it for it, _, _ in entries]
        if any(b <= a for a, b in itertools.pairwise(its)) or any(n < 1 for _, _, n in entries):
            raise ValueError(
                f"corrupt ReplayStore state: iterations must increase and num_pairs be >= 1 ({entries})."
            )
        shards = [ReplayShard(it, self.directory / name, n) for it, name, n in entries]
        missing = [str(s.path) for s in shards if not s.path.is_file()]
        if missing:
            raise FileNotFoundError(
                f"The checkpoint's replay index needs {len(missing)} shard file(s) missing from {self.directory}, "
                f"e.g. {missing[0]}. The checkpoint was written with replay directory {state.get('directory')}; "
                "set preference_replay_dir to that directory (or a copy of it) to resume."
            )
        self._shards = shards
        self.rng = rng
        self._state_loaded = True
