"""The checkpoint entries of a team module (comlrl_lightning/modules/checkpoint_state.py) and their digest
(comlrl_lightning/modules/checkpoint_seal.py), on a small host without a model or a fit. Whole runs resumed from
real ``.ckpt`` files, edited ones refused, are tests/modules/test_mid_epoch_resume.py."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from comlrl_lightning.generation import SamplingStream
from comlrl_lightning.modules.checkpoint_seal import (
    CHECKPOINT_DIGEST_KEY,
    seal_checkpoint,
    sealed_parts,
    verify_checkpoint,
)
from comlrl_lightning.modules.checkpoint_state import CheckpointState


class Host(CheckpointState):
    """Progress that repeats the rank state (as the RL modules' ``progress_state`` does), a logging gate, streams."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.team = SimpleNamespace(num_agents=2, uses_lora=False, engine=None)
        self.env_step, self.updates_seen, self.optimizer_steps = 0, 0, 0
        self._last_logged_step: int | None = None
        self.streams = [SamplingStream(seed + i) for i in range(2)]
        self.rng = random.Random(seed)
        self.buffers: list[list[int]] = [[], []]

    def progress_state(self):
        return {**super().progress_state(), "optimizer_steps": self.optimizer_steps, **self.rank_state()}

    def load_progress_state(self, state):
        super().load_progress_state(state)
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
        self.load_rank_state(state)

    def rank_state(self):
        return {"buffers": [list(b) for b in self.buffers], **self.random_state(self.streams, self.rng)}

    def load_rank_state(self, state):
        if "buffers" in state:
            self.buffers = [list(b) for b in state["buffers"]]
        self.load_random_state(state, self.streams, self.rng)


def _saved(host: Host) -> dict:
    checkpoint = {"state_dict": host.state_dict(), "callbacks": {"Cb": {"n": 1}}}
    host.on_save_checkpoint(checkpoint)
    return checkpoint


def _advanced(seed: int = 0) -> Host:
    host = Host(seed)
    host.env_step, host.updates_seen, host.optimizer_steps, host._last_logged_step = 7, 3, 5, 4
    host.buffers = [[1, 2], [3]]
    host.streams[0].next_seed()
    host.rng.random()
    return host


def test_the_rank_state_is_written_once_under_comlrl_rank_states():
    checkpoint = _saved(_advanced())
    assert checkpoint["comlrl_progress"] == {"env_step": 7, "updates_seen": 3, "optimizer_steps": 5}
    (rank0,) = checkpoint["comlrl_rank_states"]
    assert rank0["buffers"] == [[1, 2], [3]] and len(rank0["streams"]) == 2 and "shuffle_rng" in rank0
    assert checkpoint["comlrl_logging_gates"] == {"_last_logged_step": 4}
    assert checkpoint["comlrl_identity"] == {"module": "Host", "num_agents": 2, "lora": False}
    assert set(checkpoint[CHECKPOINT_DIGEST_KEY]["sha256"]) == {
        "state_dict", "callbacks", "comlrl_progress", "comlrl_rank_states", "comlrl_logging_gates"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_round_trip_restores_counters_gates_buffers_and_streams(seed):
    before = _advanced(seed)
    checkpoint = _saved(before)
    after = Host(seed + 100)
    after.on_load_checkpoint(checkpoint)
    assert (after.env_step, after.updates_seen, after.optimizer_steps, after._last_logged_step) == (7, 3, 5, 4)
    assert after.buffers == [[1, 2], [3]]
    assert [s.next_seed() for s in after.streams] == [s.next_seed() for s in before.streams]
    assert after.rng.random() == before.rng.random()


@pytest.mark.parametrize("per_rank", [True, False])
def test_older_checkpoints_with_the_rank_state_in_their_progress_still_load(per_rank):
    """Checkpoints written before the rank state was written once carry it in ``comlrl_progress`` too (or only
    there, before per-rank states); they resume as before."""
    before = _advanced()
    checkpoint = _saved(before)
    checkpoint["comlrl_progress"] = before.progress_state()
    checkpoint.pop(CHECKPOINT_DIGEST_KEY)
    if not per_rank:
        checkpoint.pop("comlrl_rank_states")
    after = Host(50)
    after.on_load_checkpoint(checkpoint)
    assert after.buffers == [[1, 2], [3]] and after.rng.random() == before.rng.random()


@pytest.mark.parametrize("part", ["state_dict", "callbacks", "comlrl_progress", "comlrl_rank_states",
                                  "comlrl_logging_gates"])
def test_an_edited_part_is_refused_naming_it(part):
    checkpoint = _saved(_advanced())
    if part == "state_dict":
        checkpoint[part]["layer.weight"] = checkpoint[part]["layer.weight"].clone()
        checkpoint[part]["layer.weight"].view(-1)[0] += 1.0
    elif part == "comlrl_rank_states":
        checkpoint[part][0]["buffers"][0].append(9)
    else:
        checkpoint[part] = {**checkpoint[part], "edited": 1}
    with pytest.raises(ValueError, match=f"corrupt: its {part} do not match the sha256 digest"):
        Host().on_load_checkpoint(checkpoint)


def test_seal_and_verify_on_their_own():
    holder = Host()
    checkpoint = {"state_dict": holder.state_dict(), "callbacks": {}}
    verify_checkpoint(holder, checkpoint)  # no digest: written by other code, accepted
    seal_checkpoint(holder, checkpoint)
    verify_checkpoint(holder, checkpoint)
    assert set(sealed_parts(holder, checkpoint, None)) == set(checkpoint[CHECKPOINT_DIGEST_KEY]["sha256"])
    checkpoint["state_dict"] = {k: torch.zeros_like(v) for k, v in checkpoint["state_dict"].items()}
    with pytest.raises(ValueError, match=r"\(given to load_from_checkpoint\) is corrupt: its state_dict"):
        verify_checkpoint(holder, checkpoint)


def test_another_team_is_refused_before_the_digest():
    checkpoint = _saved(_advanced())
    checkpoint["comlrl_identity"]["num_agents"] = 3
    with pytest.raises(ValueError, match="belongs to another run \\(num_agents: checkpoint 3, this run 2\\)"):
        Host().on_load_checkpoint(checkpoint)
