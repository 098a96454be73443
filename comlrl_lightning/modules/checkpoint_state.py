"""What a team module keeps in a checkpoint besides its weights, and how it resumes from one: a mixin of
:class:`~comlrl_lightning.modules.base.TeamModuleBase` (docs/guide.md §1.1, docs/scaling.md "Resume").

Entries (plain types: checkpoints are loaded ``weights_only``):

* ``comlrl_identity``: the module class, team size and layout (:meth:`CheckpointState.team_identity`); a checkpoint
  of another run is refused before Lightning loads its weights;
* ``comlrl_progress``: the counters every rank shares (:meth:`CheckpointState.progress_state`);
* ``comlrl_rank_states``: what differs between ranks (rollout buffers and streams, :meth:`CheckpointState.rank_state`),
  gathered from every rank; written once, here, and never again under ``comlrl_progress``;
* ``comlrl_logging_gates``: the ``logging_steps`` gates, so a run resumed mid-epoch logs at the uninterrupted run's
  steps;
* ``comlrl_digest``: sha256 digests of all of the above, the weights and the callbacks' and data module's state
  (:mod:`~comlrl_lightning.modules.checkpoint_seal`), checked first at resume.

The host (a LightningModule) provides ``team`` (``num_agents``, ``uses_lora``, ``engine``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import lightning as L

from comlrl_lightning.distributed import gather_objects, per_rank_entry, world
from comlrl_lightning.generation import SamplingStream
from comlrl_lightning.modules.checkpoint_seal import (
    refuse_round_end_position,
    seal_checkpoint,
    verify_checkpoint,
    warn_unresumable_position,
)


class CheckpointState(L.LightningModule):
    """The team module's ``on_save_checkpoint`` / ``on_load_checkpoint`` (see the module docstring); subclasses
    extend :meth:`progress_state`, :meth:`rank_state` and :attr:`LOGGING_GATES`' attributes."""

    #: Attributes holding a ``logging_steps`` gate (the progress of the last log, or None), saved in the checkpoint
    #: (``comlrl_logging_gates``) so that a run resumed mid-epoch logs at the steps the uninterrupted run logs at.
    LOGGING_GATES = ("_last_logged_step", "_last_logged_progress", "_last_logged_env_step")

    def progress_state(self) -> dict[str, Any]:
        """Counters saved in the checkpoint (plain types only)."""
        return {"env_step": self.env_step, "updates_seen": self.updates_seen}

    def load_progress_state(self, state: dict[str, Any]) -> None:
        self.env_step = int(state.get("env_step", 0))
        self.updates_seen = int(state.get("updates_seen", 0))

    def logging_gates(self) -> dict[str, int | None]:
        """The :attr:`LOGGING_GATES` this module has set, by name (plain types)."""
        own = vars(self)
        return {name: own[name] for name in self.LOGGING_GATES if name in own}

    def load_logging_gates(self, gates: dict[str, Any]) -> None:
        for name, value in gates.items():
            if name in self.LOGGING_GATES:
                setattr(self, name, None if value is None else int(value))

    def rank_state(self) -> dict[str, Any]:
        """What differs between the ranks of a multi-process run (the rollout streams, for instance; plain types).
        Saved per rank: :meth:`on_save_checkpoint` gathers it from every rank (docs/scaling.md)."""
        return {}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        """Restore this rank's entry of :meth:`rank_state` (applied after :meth:`load_progress_state`)."""

    @staticmethod
    def random_state(streams: Sequence[SamplingStream], rng: random.Random) -> dict[str, Any]:
        """The state of rollout ``streams`` and a shuffling ``rng`` (for :meth:`rank_state`)."""
        return {"streams": [s.state_dict() for s in streams], "shuffle_rng": list(rng.getstate())}

    @staticmethod
    def load_random_state(state: dict[str, Any], streams: Sequence[SamplingStream], rng: random.Random) -> None:
        """Restore what :meth:`random_state` saved (keys absent from ``state`` are left as they are)."""
        for s, stream_state in zip(streams, state.get("streams", [])):
            s.load_state_dict(stream_state)
        if "shuffle_rng" in state:
            version, internal, gauss = state["shuffle_rng"]
            rng.setstate((version, tuple(internal), gauss))

    def team_identity(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed by this module: its class, team size and layout."""
        return {"module": type(self).__name__, "num_agents": self.team.num_agents, "lora": self.team.uses_lora}

    def check_team_identity(self, checkpoint: dict) -> None:
        """Refuse a checkpoint of another trainer family, team size or layout (full models against LoRA), naming
        what differs, before Lightning loads its weights (whose own error lists parameter names)."""
        saved = checkpoint.get("comlrl_identity")
        if not isinstance(saved, dict):
            return  # written by other code, or before identities were saved
        mine = self.team_identity()
        diffs = [f"{key}: checkpoint {saved[key]!r}, this run {mine[key]!r}" for key in mine
                 if key in saved and saved[key] != mine[key]]
        if diffs:
            path = self._trainer.ckpt_path if self._trainer is not None else None
            raise ValueError(f"Checkpoint {path or '(given)'} belongs to another run ({'; '.join(diffs)}). Resume it "
                             "with the trainer, agent count and LoRA setting it was written with, or start a new "
                             "run.")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Write the entries of the module docstring. The rank state is written once, under ``comlrl_rank_states``:
        a key of :meth:`progress_state` that :meth:`rank_state` also gives is left out of ``comlrl_progress``."""
        own = self.rank_state()
        checkpoint["comlrl_identity"] = self.team_identity()
        checkpoint["comlrl_progress"] = {k: v for k, v in self.progress_state().items() if k not in own}
        checkpoint["comlrl_logging_gates"] = self.logging_gates()
        if own:  # every rank dumps the checkpoint (Lightning), so the gather is met by all; rank 0 writes it
            trainer = self._trainer
            checkpoint["comlrl_rank_states"] = gather_objects(own, world(trainer)[1] if trainer is not None else 1)
        seal_checkpoint(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Check the checkpoint (identity, digest, position), then restore the counters, the logging gates and this
        rank's rank state, and tell the generation engine that the weights changed."""
        self.check_team_identity(checkpoint)
        verify_checkpoint(self, checkpoint)
        path = self._trainer.ckpt_path if self._trainer is not None else None
        warn_unresumable_position(checkpoint, path)
        refuse_round_end_position(checkpoint, self._trainer, path)
        self.load_progress_state(checkpoint.get("comlrl_progress", {}))
        self.load_logging_gates(checkpoint.get("comlrl_logging_gates", {}))
        if self.team.engine is not None:  # the restored weights replace the ones the engine holds
            self.team.engine.sync(None)
        rank, world_size = world(self._trainer) if self._trainer is not None else (0, 1)
        states = checkpoint.get("comlrl_rank_states")
        if states is None and world_size == 1:  # a checkpoint of a single process from before per-rank states
            return
        if states is not None or self.rank_state():
            own = per_rank_entry(states if states is not None else [None], rank, world_size, type(self).__name__)
            if own:
                self.load_rank_state(own)
