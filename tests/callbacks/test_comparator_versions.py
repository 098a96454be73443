"""Comparators check that their samples come from the weights they stand for (docs/engines.md, "Verification"):
the live agents' version for current/current_copy, version 0 for a fixed model, the round's snapshot for history."""

from __future__ import annotations

import pytest
from iterative_helpers import iter_args, task_items

from comlrl_lightning.comparators.local import (
    CurrentComparator,
    CurrentCopyComparator,
    HistoryComparator,
    ModelComparator,
)
from comlrl_lightning.data.sources import format_prompts
from comlrl_lightning.engines import engine_of
from comlrl_lightning.engines.verify import EngineSyncError, check_comparator_samples
from comlrl_lightning.envs.cooperative import FORMATTERS
from comlrl_lightning.generation import Samples
from comlrl_lightning.modules.madpo import MADPOModule


@pytest.fixture
def module(tiny_model_dir):
    return MADPOModule(agent_model=str(tiny_model_dir), args=iter_args())


def _prompts():
    return format_prompts(task_items(2), FORMATTERS)


def _ready(comp, module, round_index=0):
    comp.setup(None, module)
    comp.prepare(round_index)
    return comp


def _samples(version=None, source=None):
    return Samples(prompt_ids=[[1]], completion_ids=[[[2]]], texts=[["x"]], version=version, source=source)


def test_the_pure_check_names_policy_agent_round_and_both_sides():
    check_comparator_samples("current", 0, _samples(version=3), 1, version=3)
    check_comparator_samples("history", 1, _samples(source="/s/agent_1"), 2, source="/s/agent_1")
    check_comparator_samples("model", 0, _samples(), 0, version=0, source="/s")  # unknowns are not checked
    with pytest.raises(EngineSyncError, match=r"'current' comparator's samples of agent 1 in round 4 .*version 2 "
                                              r"where the comparator stands for version 3"):
        check_comparator_samples("current", 1, _samples(version=2), 4, version=3)
    with pytest.raises(EngineSyncError, match=r"snapshot /old/agent_0 where the comparator picked /new/agent_0"):
        check_comparator_samples("history", 0, _samples(source="/old/agent_0"), 3, source="/new/agent_0")


def test_a_copy_kept_past_an_update_of_the_agents_stops_the_collection(module):
    comp = _ready(CurrentCopyComparator(always_copy=True), module)
    assert len(comp.sample(_prompts(), 1)) == 2  # healthy: the copy holds the current weights
    engine_of(module.team).sync([1])  # agent 1 takes an optimizer step; the copy is not refreshed
    with pytest.raises(EngineSyncError, match=r"'current_copy' comparator's samples of agent 1 in round 0"):
        comp.sample(_prompts(), 1)
    comp.prepare(1)  # the next round's copy is current again
    assert len(comp.sample(_prompts(), 1)) == 2


def test_the_live_agents_served_with_a_missed_sync_stop_the_current_comparator(module):
    comp = _ready(CurrentComparator(), module)
    engine = engine_of(module.team)
    assert len(comp.sample(_prompts(), 1)) == 2
    engine.weight_version = lambda agent: 7  # the trainer sent 7 updates; the engine applied none
    with pytest.raises(EngineSyncError, match=r"'current' comparator's samples of agent 0 .*version 0 where the "
                                              r"comparator stands for version 7"):
        comp.sample(_prompts(), 1)


def test_a_fixed_model_comparator_that_received_weight_updates_is_refused(tiny_model_dir, module):
    comp = _ready(ModelComparator(str(tiny_model_dir)), module)
    assert len(comp.sample_agent(0, _prompts()[0], 1).texts) == 2
    engine_of(comp.team()).sync([0])
    with pytest.raises(EngineSyncError, match=r"'model' comparator's samples of agent 0"):
        comp.sample_agent(0, _prompts()[0], 1)


def _snapshot(module, folder):
    for i, (model, tok) in enumerate(zip(module.team.models, module.team.tokenizers)):
        model.save_pretrained(folder / f"agent_{i}")
        tok.save_pretrained(folder / f"agent_{i}")


def test_history_samples_must_come_from_the_rounds_snapshot(module, tmp_path):
    _snapshot(module, tmp_path / "initial")
    _snapshot(module, tmp_path / "iteration_0000")
    comp = _ready(HistoryComparator(root=str(tmp_path), k=1), module, round_index=2)
    assert comp.loaded_from.name == "iteration_0000"
    assert len(comp.sample(_prompts(), 1)) == 2
    comp.round_index = 0  # a round whose snapshot is `initial`, without prepare
    with pytest.raises(EngineSyncError, match=r"serves the snapshot .*iteration_0000 in round 0, but the round "
                                              r"compares against .*initial"):
        comp.sample(_prompts(), 1)
    comp.prepare(2)
    engine = engine_of(comp.team())
    served = engine.sample

    def from_another_folder(*args, **kwargs):  # an engine that read another adapter folder than it was given
        out = served(*args, **kwargs)
        out.source = str(tmp_path / "initial" / "agent_0")
        return out

    engine.sample = from_another_folder
    with pytest.raises(EngineSyncError, match=r"agent 0 in round 2 .*snapshot .*initial/agent_0 where the "
                                              r"comparator picked .*iteration_0000/agent_0"):
        comp.sample_agent(0, _prompts()[0], 1)
