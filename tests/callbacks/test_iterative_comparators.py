"""Comparator sources: current (own streams), current_copy, model, history (k rule), M != N, api hook."""

from __future__ import annotations

import random

import pytest
import torch
from iterative_helpers import iter_args, make_trainer, task_items

from comlrl_lightning.comparators.local import (
    SOURCES,
    CurrentComparator,
    CurrentCopyComparator,
    HistoryComparator,
    ModelComparator,
    build_comparator,
    history_snapshot_dir,
)
from comlrl_lightning.config.iterative import POLICIES
from comlrl_lightning.data.sources import format_prompts
from comlrl_lightning.envs.cooperative import FORMATTERS
from comlrl_lightning.generation import Samples, SamplingStream
from comlrl_lightning.modules.madpo import MADPOModule
from comlrl_lightning.preferences import build_iterative_pairs, sample_team


@pytest.fixture(scope="module")
def module(tiny_model_dir):
    return MADPOModule(agent_model=str(tiny_model_dir), args=iter_args())


def _prompts(n=3):
    return format_prompts(task_items(n), FORMATTERS)


def _agent_texts(module, interleave=None):
    streams = [SamplingStream(1000 * i) for i in range(2)]
    out = []
    for _ in range(2):
        out.append([s.texts for s in sample_team(module.team, _prompts(), 3, module.sampling_settings(), streams)])
        if interleave is not None:
            interleave.sample(_prompts(), 3)
    return out


def test_current_comparator_has_its_own_stream_and_leaves_the_agents_alone(module):
    comp = CurrentComparator()
    comp.setup(None, module)
    plain = _agent_texts(module)
    with_comp = _agent_texts(module, interleave=comp)
    assert plain == with_comp  # the agents' samples do not depend on comparator sampling
    comp2 = CurrentComparator()
    comp2.setup(None, module)
    comp_texts = [s.texts for s in comp2.sample(_prompts(), 3)]
    assert comp_texts != plain[0]  # same weights, different stream
    # the comparator stream state round-trips through plain types
    state = comp2.state_dict()
    assert all(isinstance(x, int) for x in state["streams"][0])
    a = [s.texts for s in comp2.sample(_prompts(), 2)]
    comp3 = CurrentComparator()
    comp3.setup(None, module)
    comp3.load_state_dict(state)
    assert [s.texts for s in comp3.sample(_prompts(), 2)] == a


def test_current_copy_uses_live_agents_on_same_devices_and_a_frozen_copy_otherwise(module):
    comp = CurrentCopyComparator(devices="cpu")
    comp.setup(None, module)
    comp.prepare(0)
    assert comp.copy is None and comp.team() is module.team
    forced = CurrentCopyComparator(always_copy=True)
    forced.setup(None, module)
    forced.prepare(0)
    copy_model = forced.team().models[0]
    assert copy_model is not module.team.models[0]
    assert not any(p.requires_grad for p in copy_model.parameters()) and not copy_model.training
    for a, b in zip(copy_model.parameters(), module.team.models[0].parameters()):
        assert torch.equal(a, b)
    with torch.no_grad():  # later training of the live agent does not reach the copy
        next(module.team.models[0].parameters()).add_(1.0)
    assert not torch.equal(next(copy_model.parameters()), next(module.team.models[0].parameters()))
    with torch.no_grad():
        next(module.team.models[0].parameters()).sub_(1.0)
    assert len(forced.sample(_prompts(), 2)[0].texts) == 3
    forced.release()
    assert forced.copy is None


def test_model_comparator_loads_once(tiny_model_dir, module):
    comp = build_comparator(iter_args(comparator_policy="model", comparator_model_name=str(tiny_model_dir)))
    assert isinstance(comp, ModelComparator)
    comp.setup(None, module)
    comp.prepare(0)
    first = comp.team()
    comp.prepare(1)
    assert comp.team() is first and first.models[0] is not module.team.models[0]
    out = comp.sample(_prompts(), 2)
    assert len(out) == 2 and all(len(t) == 2 for t in out[0].texts)


def test_history_rule_pure(tmp_path):
    def snap(s):
        for i in range(2):
            (tmp_path / f"iteration_{s:04d}" / f"agent_{i}").mkdir(parents=True)

    def name(t, k):
        return history_snapshot_dir(tmp_path, t, k, 2).name
    assert [name(t, 1) for t in (0, 1, 2)] == ["initial", "initial", "initial"]  # nothing saved yet
    snap(0)
    snap(1)
    assert [name(t, 1) for t in (0, 1, 2, 3)] == ["initial", "initial", "iteration_0000", "iteration_0001"]
    assert [name(t, 2) for t in (0, 1, 2, 3)] == ["initial", "initial", "initial", "iteration_0000"]
    assert name(6, 1) == "iteration_0001"  # newest complete snapshot at or before the target
    (tmp_path / "iteration_0002" / "agent_0").mkdir(parents=True)  # incomplete: skipped
    assert name(4, 1) == "iteration_0001"


class _RecordingHistory(HistoryComparator):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.used: list[tuple[int, str]] = []

    def prepare(self, round_index):
        super().prepare(round_index)
        self.used.append((round_index, self.loaded_from.name))


@pytest.mark.parametrize("k,expected", [(1, ["initial", "initial", "iteration_0000"]),
                                        (2, ["initial", "initial", "initial"])])
def test_history_comparator_over_three_rounds(tiny_model_dir, tmp_path, k, expected):
    args = iter_args(num_iterations=3, comparator_policy="history", comparator_history_k=k)
    comp = _RecordingHistory()
    tr = make_trainer(tiny_model_dir, tmp_path, args=args, num_items=3, comparator=comp)
    tr.train()
    assert [name for _, name in comp.used] == expected
    snaps = tmp_path / "policy_checkpoints"
    assert sorted(p.name for p in snaps.iterdir()) == ["initial", "iteration_0000", "iteration_0001", "iteration_0002"]
    for d in ("initial", "iteration_0002"):
        assert (snaps / d / "agent_0" / "config.json").is_file() and (snaps / d / "agent_1" / "config.json").is_file()


def test_history_snapshots_with_lora_hold_only_adapters(tiny_model_dir, tmp_path):
    args = iter_args(num_iterations=2, comparator_policy="history")
    comp = _RecordingHistory()
    tr = make_trainer(tiny_model_dir, tmp_path, args=args, num_items=3, comparator=comp,
                      lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    tr.train()
    agent = tmp_path / "policy_checkpoints" / "iteration_0001" / "agent_1"
    assert (agent / "adapter_config.json").is_file() and not (agent / "config.json").exists()
    assert [name for _, name in comp.used] == ["initial", "initial"]


def _samples(per_item: list[list[str]], agent: int) -> Samples:
    return Samples(prompt_ids=[[] for _ in per_item], completion_ids=[[[] for _ in c] for c in per_item],
                   texts=[[c.split("|")[agent] for c in cands] for cands in per_item])


def _score(prompts, texts, item, idx):
    r = float(len(texts[0]))
    return r, r * 10


@pytest.mark.parametrize("n,m", [(4, 2), (2, 4)])
def test_candidate_count_mismatch(n, m):
    cur = [["a|x", "bbbb|x", "cc|x", "dddddd|x"][:n]]
    comp = [["aaa|y", "b|y", "eeeeeeee|y", "c|y"][:m]]
    prompts = [["p0"], ["q0"]]
    current = [_samples(cur, a) for a in range(2)]
    comparator = [_samples(comp, a) for a in range(2)]
    pairs, stats = build_iterative_pairs([{}], prompts, current, comparator, _score, "all", None, random.Random(0))
    assert stats.comparisons == 2 and len(pairs) == 2  # only min(N, M) aligned comparisons
    assert stats.wins == 1 and stats.num_ties == 0
    every = [len(c.split("|")[0]) for c in cur[0] + comp[0]]
    assert all(p.candidate_reward_mean == pytest.approx(sum(every) / len(every)) for p in pairs)
    p0, p1 = pairs  # j=0: comparator "aaa" beats "a"; j=1: current "bbbb" beats "b"
    assert p0.winner_completions == ["aaa", "y"] and p0.loser_completions == ["a", "x"]
    assert p0.target_raw_reward == 10 and p0.comparator_raw_reward == 30 and p0.raw_rewards == [30, 10]
    assert p1.winner_completions == ["bbbb", "x"] and p1.target_raw_reward == 40
    assert p0.prompts == ["p0", "q0"] and p0.winner_token_ids is None


def test_comparator_num_candidates_in_a_run(tiny_model_dir, tmp_path):
    args = iter_args(num_iterations=1, preference_num_candidates=4, comparator_num_candidates=2,
                     pair_selection="all", preference_pairs_per_sample=None)
    tr = make_trainer(tiny_model_dir, tmp_path, args=args, num_items=3)
    tr.train()
    h = tr.collection.history[0]
    assert h["round/num_pairs"] <= 3 * 2


def test_api_policy_builds_the_http_client_when_available():
    args = iter_args(comparator_policy="api", comparator_api_url="http://127.0.0.1:9/v1")
    comp = build_comparator(args)
    assert comp.policy == "api" and hasattr(comp.client, "generate")


def test_one_source_class_per_configured_policy():
    """The factory map and the config's policy table name the same policies; an unknown name is refused with the
    table's list (a config object that skipped the check, e.g. edited after it was built)."""
    assert list(SOURCES) == list(POLICIES)
    assert all(cls.policy == name for name, cls in SOURCES.items())
    args = iter_args()
    args.comparator_policy = "nearest"
    with pytest.raises(ValueError, match=r"comparator_policy must be one of: current, current_copy, model, history, "
                                         r"api\. Got 'nearest'"):
        build_comparator(args)


class _SpawningEngine:
    """An HF engine that, like the vLLM one, makes engines for comparator teams (``engine_for``) and records
    which teams it served and which engines were closed."""

    closed: list = []
    made: list = []

    def __init__(self, team):
        from comlrl_lightning.engines import HFEngine

        self.team, self.inner, self.calls = team, HFEngine(team), 0

    def sample(self, *a, **k):
        self.calls += 1
        return self.inner.sample(*a, **k)

    def sample_many(self, requests, settings):
        self.calls += 1
        return self.inner.sample_many(requests, settings)

    def sync(self, agent_indices=None):
        pass

    def close(self):
        _SpawningEngine.closed.append(self)

    def engine_for(self, team):
        engine = _SpawningEngine(team)
        _SpawningEngine.made.append(engine)
        return engine


@pytest.mark.parametrize("fails", [False, True])
def test_model_comparator_on_the_learners_backend_is_closed_at_the_end(tiny_model_dir, tmp_path, fails):
    """A learner engine that can make engines (vLLM's ``engine_for``) serves the ``model`` comparator with an engine
    of its own, sampled in every round and kept across rounds; ComparatorRefresh closes it when the fit ends or
    fails, and never closes the learner's engine. ``current_copy`` on such an engine makes no torch copy."""
    import lightning as L

    _SpawningEngine.closed, _SpawningEngine.made = [], []
    args = iter_args(num_iterations=2, comparator_policy="model", comparator_model_name=str(tiny_model_dir))

    class Boom(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            if fails and trainer.current_epoch == 1:
                raise RuntimeError("stop here")

    tr = make_trainer(tiny_model_dir, tmp_path, args=args, num_items=3, callbacks=[Boom()])
    live = _SpawningEngine(tr.module.team)
    tr.module.team.engine = live
    if fails:
        with pytest.raises(RuntimeError, match="stop here"):
            tr.train()
    else:
        tr.train()
    (served,) = _SpawningEngine.made  # one engine for the comparator, made once for both rounds
    assert served.team is not tr.module.team and served.calls >= 2
    assert live.calls >= 2 and _SpawningEngine.closed == [served]

    copy = CurrentCopyComparator(always_copy=True)
    copy.setup(None, tr.module)
    copy.prepare(0)
    assert copy.copy is None and copy.team() is tr.module.team
