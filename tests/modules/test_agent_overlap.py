"""``agent_overlap``: the agents' generation calls of one level run at the same time, one thread per group
(``HFEngine.sample_many``), and the results equal the calls made one after another (docs/architecture.md,
"Devices")."""

from __future__ import annotations

import threading

import pytest
import torch
import yaml
from conftest import cpu_trainer_kwargs

import comlrl_lightning.engines.hf as hf_engine
from comlrl_lightning.agents import build_agents
from comlrl_lightning.config import IACConfig, MAGRPOConfig
from comlrl_lightning.devices import normalize_agent_overlap, overlap_groups
from comlrl_lightning.engines import HFEngine, SampleRequest
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.generation import Samples, SamplingSettings, SamplingStream
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

PROMPTS = ["Topic: rivers.", "Topic: chess.", "Topic: bread."]
SETTINGS = SamplingSettings(max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None)
ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread")]


@pytest.fixture(scope="module")
def team(tiny_model_dir):
    return build_agents(tiny_model_dir, num_agents=2)


def _requests(seed: int = 0) -> list[SampleRequest]:
    return [SampleRequest(a, PROMPTS, 3, SamplingStream(seed + a)) for a in range(2)]


def test_with_overlap_on_the_agents_calls_run_at_the_same_time(team, monkeypatch):
    """A stand-in for generation that returns only when both agents are inside it at once: it completes with
    overlap on (a sequential dispatch would break the barrier after its timeout, not hang)."""
    barrier = threading.Barrier(2, timeout=10)
    seen = []

    def generate_together(model, tokenizer, prompts, k, settings, stream, max_batch_rows):
        barrier.wait()
        seen.append(threading.get_ident())
        return Samples([[0]] * len(prompts), [[[id(model)]] * k] * len(prompts), [[""] * k] * len(prompts))

    monkeypatch.setattr(hf_engine, "sample_completions", generate_together)
    out = HFEngine(team, overlap="on").sample_many(_requests(), SETTINGS)
    assert [s.completion_ids[0][0][0] for s in out] == [id(m) for m in team.models]  # agent order
    assert len(set(seen)) == 2 and threading.get_ident() not in seen
    # Off: the first agent waits alone at the barrier, which breaks.
    barrier = threading.Barrier(2, timeout=0.2)
    with pytest.raises(threading.BrokenBarrierError):
        HFEngine(team, overlap="off").sample_many(_requests(), SETTINGS)


def test_a_level_with_overlap_equals_the_sequential_level_and_keeps_the_global_rng(team):
    torch.manual_seed(7)
    before = torch.get_rng_state().clone()
    on = HFEngine(team, overlap="on")
    assert on.workers(_requests(), SETTINGS) == [[0], [1]]
    streams_on, streams_off = _requests(3), _requests(3)
    got = on.sample_many(streams_on, SETTINGS)
    assert torch.equal(torch.get_rng_state(), before)
    assert got == HFEngine(team, overlap="off").sample_many(streams_off, SETTINGS)
    assert got[0] != got[1]  # the agents' own streams, not one shared draw
    assert [r.stream.next_seed() for r in streams_on] == [r.stream.next_seed() for r in streams_off]


def test_who_overlaps(team, tiny_model_dir):
    cpu, gpu0, gpu1 = torch.device("cpu"), torch.device("cuda:0"), torch.device("cuda:1")
    a, b = object(), object()
    assert overlap_groups([gpu0, gpu1, gpu0], [a, b, a], "auto") == [[0, 2], [1]]
    assert overlap_groups([cpu, cpu], [a, b], "auto") == [[0, 1]]
    assert overlap_groups([cpu, cpu, cpu], [a, a, b], "on") == [[0, 1], [2]]
    assert overlap_groups([gpu0, gpu1], [a, b], "off") == [[0, 1]]
    # Both tiny agents are on the CPU: "auto" keeps them sequential.
    assert HFEngine(team).workers(_requests(), SETTINGS) == [[0, 1]]
    # LoRA agents are adapters of one model: never at once.
    lora = build_agents(tiny_model_dir, num_agents=2, lora={"r": 4, "lora_alpha": 8})
    assert HFEngine(lora, overlap="on").workers(_requests(), SETTINGS) == [[0, 1]]
    # A setting HF must draw itself (from the global RNG) keeps the level sequential.
    min_p = SamplingSettings(max_new_tokens=6, extra={"min_p": 0.1})
    assert HFEngine(team, overlap="on").workers(_requests(), min_p) == [[0, 1]]


def test_the_option_is_checked_and_normalized():
    assert [normalize_agent_overlap(v) for v in (None, " Auto", "ON", "off", True, False)] == \
           ["auto", "auto", "on", "off", "on", "off"]
    assert normalize_agent_overlap(yaml.safe_load("agent_overlap: on")["agent_overlap"]) == "on"  # YAML 1.1 bool
    assert MAGRPOConfig(agent_overlap="On").agent_overlap == "on" and IACConfig().agent_overlap == "auto"
    for bad in ("sometimes", 2, ["on"]):
        with pytest.raises(ValueError, match=r"^agent_overlap must be one of: auto, on, off\. Got .*Allowed: auto"):
            MAGRPOConfig(agent_overlap=bad)
    with pytest.raises(ValueError, match="agent_overlap"):
        HFEngine(None, overlap="threads")


def _fit(model_dir, overlap, monkeypatch):
    pools = []

    class CountingPool(hf_engine.ThreadPoolExecutor):
        def __init__(self, *args, **kwargs):
            pools.append(kwargs.get("max_workers"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(hf_engine, "ThreadPoolExecutor", CountingPool)
    args = MAGRPOConfig(num_train_epochs=1, num_generations=2, max_new_tokens=6, temperature=1.0, top_p=1.0,
                        top_k=None, agent_learning_rate=1e-2, eval_interval=0, eval_num_samples=1,
                        rollout_buffer_size=1, agent_overlap=overlap)
    tr = MAGRPOTrainer(agent_model=model_dir, train_dataset=ITEMS, reward_func=cooperative_reward,
                       formatters=FORMATTERS, args=args, trainer_kwargs=cpu_trainer_kwargs(max_steps=2))
    before = [p.detach().clone() for p in tr.team.parameters_of(1)]
    tr.train()
    assert tr.trainer.global_step == 2 and any(not torch.equal(a, b) for a, b in zip(before, tr.team.parameters_of(1)))
    return [[p.detach().clone() for p in tr.team.parameters_of(i)] for i in range(2)], pools


def test_a_magrpo_step_with_overlap_equals_the_sequential_step(tiny_model_dir, monkeypatch):
    on, pools_on = _fit(tiny_model_dir, "on", monkeypatch)
    off, pools_off = _fit(tiny_model_dir, "off", monkeypatch)
    assert pools_on and set(pools_on) == {2} and pools_off == []
    for agent_on, agent_off in zip(on, off):
        assert all(torch.equal(a, b) for a, b in zip(agent_on, agent_off))
