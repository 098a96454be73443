"""``agent_overlap``: the agents' generation calls of one level (``HFEngine.sample_many``) and the agents' updates of
one drain (``TeamModuleBase.run_agent_updates``) run at the same time, one thread per group, and the results equal
the calls made one after another (docs/architecture.md, "Devices")."""

from __future__ import annotations

import threading

import pytest
import torch
import yaml
from conftest import cpu_trainer_kwargs

import comlrl_lightning.engines.hf as hf_engine
import comlrl_lightning.overlap as overlap
from comlrl_lightning.agents import build_agents
from comlrl_lightning.config import IACConfig, MAACConfig, MAGRPOConfig
from comlrl_lightning.devices import normalize_agent_overlap, overlap_groups
from comlrl_lightning.engines import HFEngine, SampleRequest
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.generation import Samples, SamplingSettings, SamplingStream
from comlrl_lightning.modules.magrpo import MAGRPOModule
from comlrl_lightning.multiturn.transitions import plain_transition
from comlrl_lightning.trainers.actor_critic import IACTrainer, MAACTrainer
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


class _Workers:
    """Records the thread name of every worker :func:`~comlrl_lightning.overlap.run_jobs` starts (one hand-over
    handle per worker): ``agent-overlap-*`` for generation, ``agent-update-*`` for updates."""

    def __init__(self, monkeypatch):
        self.names: list[str] = []
        names = self.names

        class Recording(overlap._Handover):
            def __init__(self, *args, **kwargs):
                names.append(threading.current_thread().name)
                super().__init__(*args, **kwargs)

        monkeypatch.setattr(overlap, "_Handover", Recording)

    def of(self, kind: str) -> list[str]:
        return [n for n in self.names if n.startswith(f"agent-{kind}-")]


def _magrpo(model_dir, overlap_mode, **kwargs):
    args = MAGRPOConfig(**{**dict(num_train_epochs=1, num_generations=2, max_new_tokens=6, temperature=1.0, top_p=1.0,
                                  top_k=None, agent_learning_rate=1e-2, eval_interval=0, eval_num_samples=1,
                                  rollout_buffer_size=1, agent_overlap=overlap_mode), **kwargs})
    return MAGRPOTrainer(agent_model=model_dir, train_dataset=ITEMS, reward_func=cooperative_reward,
                         formatters=FORMATTERS, external_transition=plain_transition if args.num_turns > 1 else None,
                         args=args, trainer_kwargs=cpu_trainer_kwargs())


def _fit(model_dir, overlap_mode, monkeypatch, **kwargs):
    workers = _Workers(monkeypatch)
    tr = _magrpo(model_dir, overlap_mode, **kwargs)
    before = [p.detach().clone() for p in tr.team.parameters_of(1)]
    tr.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.team.parameters_of(1)))
    weights = [[p.detach().clone() for p in tr.team.parameters_of(i)] for i in range(2)]
    return weights, workers, tr


@pytest.mark.parametrize("turns", [1, 2])
def test_a_magrpo_fit_with_overlap_equals_the_sequential_fit(tiny_model_dir, monkeypatch, turns):
    """Generation and updates both run in two workers with "on"; the weights, the optimizer step count and the
    logged losses equal the agent-after-agent fit exactly."""
    on, workers_on, tr_on = _fit(tiny_model_dir, "on", monkeypatch, num_turns=turns, train_batch_size=1)
    off, workers_off, tr_off = _fit(tiny_model_dir, "off", monkeypatch, num_turns=turns, train_batch_size=1)
    assert len(workers_on.of("overlap")) >= 2 and len(workers_on.of("update")) >= 2 and workers_off.names == []
    assert tr_on.trainer.global_step == tr_off.trainer.global_step >= 2 * len(ITEMS) * turns
    assert tr_on.module.optimizer_steps == tr_off.module.optimizer_steps == tr_on.trainer.global_step
    for agent_on, agent_off in zip(on, off):
        assert all(torch.equal(a, b) for a, b in zip(agent_on, agent_off))


def test_the_agents_updates_run_at_the_same_time(tiny_model_dir, monkeypatch):
    """Each minibatch loss waits at a barrier that opens only when both agents are inside one at once."""
    original = MAGRPOModule.minibatch_loss
    barrier = threading.Barrier(2, timeout=10)

    def together(self, agent, minibatch):
        barrier.wait()
        return original(self, agent, minibatch)

    monkeypatch.setattr(MAGRPOModule, "minibatch_loss", together)
    _magrpo(tiny_model_dir, "on").train()
    barrier = threading.Barrier(2, timeout=0.2)
    with pytest.raises(threading.BrokenBarrierError):
        _magrpo(tiny_model_dir, "off").train()


def test_a_failing_agent_stops_the_overlapped_fit_with_its_own_error(tiny_model_dir, monkeypatch):
    original = MAGRPOModule.minibatch_loss

    def nan_for_agent_1(self, agent, minibatch):
        loss = original(self, agent, minibatch)
        return loss * float("nan") if agent == 1 else loss

    monkeypatch.setattr(MAGRPOModule, "minibatch_loss", nan_for_agent_1)
    workers = _Workers(monkeypatch)
    with pytest.raises(FloatingPointError, match="MAGRPO loss of agent 1 is nan"):
        _magrpo(tiny_model_dir, "on").train()
    assert workers.of("update")


def test_dropout_keeps_the_updates_sequential_and_says_why_once(tiny_model_dir, monkeypatch):
    workers = _Workers(monkeypatch)
    tr = _magrpo(tiny_model_dir, "on")
    tr.team.models[1].config.attention_dropout = 0.1
    with pytest.warns(UserWarning, match=r"agent_overlap='on': the agents' updates run one after another because a "
                                         r"trained model has dropout") as record:
        tr.train()
    assert sum("agent_overlap='on'" in str(w.message) for w in record) == 1
    assert workers.of("update") == [] and workers.of("overlap")


def _iac(model_dir, cls, config, overlap_mode, **kwargs):
    torch.manual_seed(0)  # the critics' fresh value heads
    args = config(num_turns=2, agent_learning_rate=1e-2, critic_learning_rate=1e-2, max_new_tokens=4,
                  temperature=1.0, top_p=1.0, num_train_epochs=1, eval_interval=0, rollout_buffer_size=1,
                  train_batch_size=1, agent_overlap=overlap_mode, **kwargs)
    tr = cls(agent_model=model_dir, reward_func=cooperative_reward, formatters=FORMATTERS,
             external_transition=plain_transition, train_dataset=ITEMS, args=args,
             trainer_kwargs=cpu_trainer_kwargs(max_steps=2))
    tr.train()
    return tr


@pytest.mark.parametrize("separate", [True, False])
def test_iac_updates_overlap_and_equal_the_sequential_ones_maac_stays_sequential(tiny_model_dir, monkeypatch,
                                                                                 separate):
    """IAC with separate critics, and with value heads attached to the agents."""
    workers = _Workers(monkeypatch)
    on = _iac(tiny_model_dir, IACTrainer, IACConfig, "on", use_separate_critic=separate)
    assert len(workers.of("update")) >= 2
    del workers.names[:]
    off = _iac(tiny_model_dir, IACTrainer, IACConfig, "off", use_separate_critic=separate)
    assert workers.names == [] and on.trainer.global_step == off.trainer.global_step > 0
    for a, b in zip(on.module.state_dict().values(), off.module.state_dict().values()):
        assert torch.equal(a, b)
    maac = _iac(tiny_model_dir, MAACTrainer, MAACConfig, "on")
    assert workers.of("update") == [] and maac.trainer.global_step > 0  # one critic: one group


def test_with_update_overlap_every_lightning_hook_still_runs_on_the_training_thread(tiny_model_dir, monkeypatch):
    """The hooks around each backward and each optimizer step are handed to the training thread: the same hooks,
    as many times as in the sequential fit, none of them on a worker."""
    import lightning as L

    class Hooks(L.Callback):
        def __init__(self):
            self.calls: list[tuple[str, str]] = []

        def _seen(self, name):
            self.calls.append((name, threading.current_thread().name))

        def on_before_backward(self, trainer, pl_module, loss):
            self._seen("before_backward")

        def on_after_backward(self, trainer, pl_module):
            self._seen("after_backward")

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self._seen("before_optimizer_step")

    counts = {}
    for mode in ("on", "off"):
        workers = _Workers(monkeypatch)
        hooks = Hooks()
        tr = _magrpo(tiny_model_dir, mode, num_turns=2)
        tr.trainer.callbacks.append(hooks)
        tr.train()
        assert {thread for _, thread in hooks.calls} == {threading.main_thread().name}
        assert bool(workers.of("update")) == (mode == "on")
        counts[mode] = sorted(name for name, _ in hooks.calls)
        assert counts[mode].count("before_optimizer_step") == tr.trainer.global_step > 0
    assert counts["on"] == counts["off"]


def _madpo(model_dir, overlap_mode, **kwargs):
    from comlrl_lightning.config import MADPOConfig
    from comlrl_lightning.trainers.preference import MADPOTrainer

    items = ITEMS + [{"prompt": f"Topic: {t}."} for t in ("trains", "music", "owls", "maps")]
    args = MADPOConfig(**{**dict(num_train_epochs=2, preference_num_candidates=4, preference_pairs_per_sample=2,
                                  max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2,
                                  train_batch_size=4, eval_interval=0, eval_num_samples=1,
                                  agent_overlap=overlap_mode), **kwargs})
    tr = MADPOTrainer(agent_model=model_dir, train_dataset=items, reward_func=cooperative_reward,
                      formatters=FORMATTERS, args=args, trainer_kwargs=cpu_trainer_kwargs())
    tr.train()
    return tr


@pytest.mark.parametrize("accumulate", [1, 2])
def test_madpo_forwards_and_joint_backward_overlap_and_equal_the_sequential_update(tiny_model_dir, monkeypatch,
                                                                                      accumulate):
    """MADPO with "on": the agents' forwards and their shares of the joint backward run in two workers; the
    weights after the fit are bit-equal to the sequential fit's (one backward of the joint loss)."""
    workers = _Workers(monkeypatch)
    on = _madpo(tiny_model_dir, "on", gradient_accumulation_steps=accumulate)
    assert len(workers.of("update")) >= 4  # forwards and backwards, per batch
    del workers.names[:]
    off = _madpo(tiny_model_dir, "off", gradient_accumulation_steps=accumulate)
    assert workers.names == [] and on.trainer.global_step == off.trainer.global_step > 0
    for i in range(2):
        after_on, after_off = list(on.team.parameters_of(i)), list(off.team.parameters_of(i))
        assert all(torch.equal(a, b) for a, b in zip(after_on, after_off))
