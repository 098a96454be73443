"""The on-disk replay store of the iterative trainers (docs/preference.md §3.7, §4; docs/decisions.md, decision 6).

:class:`ReplayStore` writes every round to ``iteration_{I:04d}.json``, keeps the index of shards
(non-empty rounds) and the replay RNG, and draws each round's training pairs with the pure functions
of :mod:`comlrl_lightning.replay`. Both names are re-exported there.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from comlrl_lightning.config.checks import is_int
from comlrl_lightning.files import json_digest, write_text_atomic
from comlrl_lightning.replay import (
    REPLAY_MODES,
    Rng,
    allocate_draws,
    gather_draws,
    replay_sample_size,
    rng_from_plain,
    rng_state_to_plain,
    shard_weights,
)

__all__ = ["ReplayShard", "ReplayStore"]

logger = logging.getLogger("comlrl_lightning.replay")  # the replay buffer's one logger name, for users' filters

_FILE_RE = re.compile(r"^iteration_(\d{4,})\.json$")
_STATE_VERSION = 1


class ReplayShard(NamedTuple):
    """A non-empty round on disk: 1-based ``iteration``, file ``path``, ``num_pairs`` ≥ 1, and the ``sha256``
    digest of its pairs (None in states written before digests existed)."""

    iteration: int
    path: Path
    num_pairs: int
    sha256: str | None = None


class ReplayStore:
    """Round files in ``directory``, the shard index, and the replay RNG (docs/preference.md §3.7, §4).

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

        The file is compact UTF-8 JSON ``{"iteration": I, "num_pairs": n, "pairs": [...], "sha256": d}`` with
        non-ASCII text kept (``d`` = :func:`~comlrl_lightning.files.json_digest` of ``pairs``, checked on load),
        written to a temp file in the same directory, fsynced, then renamed over the target (``os.replace``),
        so a crash never leaves a half-written round. NaN or infinite numbers are rejected. Rewriting an
        iteration that is already registered (a resumed run replaying a round) drops it and any later shard
        from the index first.
        """
        if not is_int(iteration) or iteration < 1:
            raise ValueError(f"replay iteration numbers are 1-based ints, got {iteration!r}.")
        pairs = list(pairs)
        for j, p in enumerate(pairs):
            if not isinstance(p, dict):
                raise TypeError(
                    f"pair {j} of iteration {iteration} is a {type(p).__name__}, expected a dict."
                )
        self._warn_leftovers()
        path = self.file_for(iteration)
        try:
            digest = json_digest(pairs)
            payload = {"iteration": iteration, "num_pairs": len(pairs), "pairs": pairs, "sha256": digest}
            text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ValueError(f"cannot write {path}: a pair is not plain finite JSON ({err}).") from err
        write_text_atomic(path, text)
        self._register(iteration, path, len(pairs), digest)
        return path

    def register_round(self, iteration: int, pairs: Sequence[dict[str, Any]]) -> Path:
        """Add round ``iteration`` to the index without writing its file: the ranks other than 0 of a
        multi-process run keep the same index as rank 0, which alone writes (docs/scaling.md)."""
        if not is_int(iteration) or iteration < 1:
            raise ValueError(f"replay iteration numbers are 1-based ints, got {iteration!r}.")
        pairs = list(pairs)
        path = self.file_for(iteration)
        self._register(iteration, path, len(pairs), json_digest(pairs))
        return path

    def _register(self, iteration: int, path: Path, num_pairs: int, digest: str) -> None:
        stale = [s for s in self._shards if s.iteration >= iteration]
        if stale:
            logger.warning(
                "Replay iteration %d rewritten; dropping shards of iterations %s from the index.",
                iteration,
                [s.iteration for s in stale],
            )
            self._shards = [s for s in self._shards if s.iteration < iteration]
        if num_pairs:
            self._shards.append(ReplayShard(iteration, path, num_pairs, digest))

    def load_shard(self, shard: ReplayShard) -> list[dict[str, Any]]:
        """The pair records of ``shard``, after checking the file against the index.

        Raises ``FileNotFoundError`` when the file is missing and ``ValueError`` when it is not
        valid JSON, has the wrong top level, holds a non-dict record, its ``iteration`` /
        ``num_pairs`` disagree with the index, or its pairs do not match their ``sha256`` digest (an edited
        file) or the digest the index recorded when the round was written; every message names the file.
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
        if not isinstance(data, dict) or set(data) != {"iteration", "num_pairs", "pairs", "sha256"}:
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ValueError(
                f"Replay shard {path} is corrupt: expected an object with keys iteration, num_pairs, pairs, sha256; "
                f"got {got}."
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
        try:
            digest = json_digest(pairs)
        except ValueError as err:
            raise ValueError(f"Replay shard {path} is corrupt: a pair is not plain finite JSON ({err}).") from err
        if digest != data["sha256"] or (shard.sha256 is not None and digest != shard.sha256):
            raise ValueError(
                f"Replay shard {path} was modified after it was written: its pairs do not match the sha256 digest "
                f"{'in the file' if digest != data['sha256'] else 'recorded in the replay index'}. Restore the "
                "original file (or start a new run)."
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
        """The pairs round ``t`` trains on (docs/preference.md §4.1 step 2-3); call after :meth:`write_round`.

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
        return gather_draws(counts, lambda i: self.load_shard(self._shards[i]), rng)

    # -- checkpoint state -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Shard index and RNG state as plain lists/dicts/str/int (safe for ``weights_only`` loads)."""
        return {
            "version": _STATE_VERSION,
            "directory": str(self.directory),
            "shards": [
                {"iteration": s.iteration, "file": Path(s.path).name, "num_pairs": s.num_pairs, "sha256": s.sha256}
                for s in self._shards
            ],
            "rng": rng_state_to_plain(self.rng),
        }

    def load_state_dict(self, state: dict[str, Any], check_files: bool = True) -> None:
        """Restore the index and RNG of :meth:`state_dict`; shard files must exist in ``directory`` unless
        ``check_files`` is False (ranks that never read the files, docs/scaling.md)."""
        try:
            version = state["version"]
            entries = [(int(e["iteration"]), str(e["file"]), int(e["num_pairs"])) for e in state["shards"]]
            digests = [e.get("sha256") for e in state["shards"]]
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
        shards = [ReplayShard(it, self.directory / name, n, d) for (it, name, n), d in zip(entries, digests)]
        missing = [str(s.path) for s in shards if check_files and not s.path.is_file()]
        if missing:
            raise FileNotFoundError(
                f"The checkpoint's replay index needs {len(missing)} shard file(s) missing from {self.directory}, "
                f"e.g. {missing[0]}. The checkpoint was written with replay directory {state.get('directory')}; "
                "set preference_replay_dir to that directory (or a copy of it) to resume."
            )
        self._shards = shards
        self.rng = rng
        self._state_loaded = True
