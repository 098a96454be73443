"""The vLLM engine (docs/engines.md), in an environment with vLLM (``tools/install_vllm_env.sh --test``): weights
are synced token for token (greedy, float32) for LoRA and full-weight agents, fits run with
``generation_backend="vllm"``, and engines leave no process and no shared memory behind.

Engine start takes 45-95 s here, so these tests are few and share what they can. Skipped without vLLM.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from conftest import cpu_trainer_kwargs  # noqa: E402

from comlrl_lightning.agents import build_agents  # noqa: E402
from comlrl_lightning.engines import HFEngine, SampleRequest  # noqa: E402
from comlrl_lightning.engines.vllm import EngineError, VLLMEngine  # noqa: E402
from comlrl_lightning.engines.vllm_process import orphan_shm  # noqa: E402
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward  # noqa: E402
from comlrl_lightning.generation import SamplingSettings, SamplingStream  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = ["Topic: rivers.", "Topic: bread and cheese.", "Write a short answer about trains."]
GREEDY = SamplingSettings(max_new_tokens=10, temperature=1.0, top_p=1.0, top_k=1)
ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]
SMALL_KV = {"kv_cache_memory_bytes": 32 * 2**20}


def _leftovers(shm_before: set[str]) -> tuple[list[str], list[str]]:
    """Child processes still alive (multiprocessing's resource tracker aside) and /dev/shm entries created since
    ``shm_before`` that no live process maps (orphans; entries of another program running on the machine are
    mapped by it), after giving exiting processes a few seconds."""
    import psutil

    deadline = time.monotonic() + 15
    while True:
        kids = [p for p in psutil.Process().children(recursive=True)
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                and "resource_tracker" not in " ".join(p.cmdline())]
        shm = orphan_shm(shm_before, prefixes=None)
        if (not kids and not shm) or time.monotonic() > deadline:
            return [f"{p.pid} {p.name()}" for p in kids], shm
        time.sleep(0.5)


def _train(team, agent: int, steps: int = 3, lr: float = 3e-2) -> None:
    """A few AdamW steps of next-token loss on fixed text (enough to change the greedy tokens)."""
    tok = team.tokenizers[agent]
    ids = torch.tensor([tok("Topic: rivers. The quick brown fox jumps over the lazy dog. " * 2)["input_ids"]])
    opt = torch.optim.AdamW(team.parameters_of(agent), lr=lr)
    with team.activate(agent) as model:
        model.train()
        for _ in range(steps):
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()


def test_grouped_lora_ops_match_vllms_cpu_ops_and_are_installed_in_its_modules():
    """Ours against vLLM's own CPU LoRA ops on random inputs (adapter rows grouped and interleaved), for all six."""
    import importlib

    from comlrl_lightning.engines import vllm_lora_ops as ours

    names = ("vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.ops.torch_ops", "vllm.lora.punica_wrapper.punica_cpu")
    modules = [importlib.import_module(n) for n in names]
    saved = {(m, op): getattr(m, op) for m in modules for op in ours.OPS}
    theirs = modules[0]
    try:
        assert ours.install()
        assert all(getattr(m, op) is getattr(ours, op) for m in modules for op in ours.OPS)
        g = torch.Generator().manual_seed(0)
        x, a, b = torch.randn(10, 32, generator=g), torch.randn(3, 1, 8, 32, generator=g), torch.randn(3, 1, 48, 8, generator=g)
        seq = (torch.tensor([0, 4, 7]), torch.tensor([4, 3, 3]), torch.tensor([2, 0, 1]), 3, 4, 10)
        for idx in (torch.tensor([0] * 4 + [2] * 6), torch.tensor([t % 3 for t in range(10)])):
            for fn in ("bgmv_shrink", "sgmv_shrink"):
                args = (idx, 0.5) if fn == "bgmv_shrink" else (*seq, 0.5)
                y1, y2 = torch.zeros(10, 8), torch.zeros(10, 8)
                saved[(theirs, fn)](x, a, y1, *args)
                getattr(ours, fn)(x, a, y2, *args)
                assert torch.allclose(y1, y2, atol=1e-5), fn
            h = torch.randn(10, 8, generator=g)
            for fn, extra in (("bgmv_expand", (True,)), ("bgmv_expand_slice", (8, 48, True)),
                              ("sgmv_expand", (True,)), ("sgmv_expand_slice", (8, 48, False))):
                args = (idx, *extra) if fn.startswith("bgmv") else (*seq, *extra)
                o1, o2 = torch.ones(10, 64), torch.ones(10, 64)
                saved[(theirs, fn)](h, b, o1, *args)
                getattr(ours, fn)(h, b, o2, *args)
                assert torch.allclose(o1, o2, atol=1e-5), fn
    finally:
        for (m, op), fn in saved.items():
            setattr(m, op, fn)


def _hf(team, n):
    return [HFEngine(team).sample(a, PROMPTS, 1, GREEDY, SamplingStream(a)) for a in range(n)]


def _engine(team, n, engine):
    return engine.sample_many([SampleRequest(a, PROMPTS, 1, SamplingStream(a)) for a in range(n)], GREEDY)


@pytest.mark.parametrize("layout", ["lora", "full"])
def test_engine_tokens_equal_the_trained_hf_model_after_every_sync(vllm_model_dir, layout, tmp_path):
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    n = 2 if layout == "lora" else 1
    lora = {"r": 8, "lora_alpha": 16, "init_lora_weights": False} if layout == "lora" else None
    team = build_agents(vllm_model_dir, num_agents=n, lora=lora)
    engine = VLLMEngine(team, SMALL_KV)
    try:
        first = _engine(team, n, engine)  # LoRA: both adapters in one mixed call
        if layout == "lora":  # served through the grouped LoRA ops (vllm_lora_ops)
            assert engine.servers[0].llm.collective_rpc("comlrl_lora_ops") == ["grouped"]
        assert [s.completion_ids for s in first] == [s.completion_ids for s in _hf(team, n)]
        for round_ in range(2):  # k training steps, sync, compare; twice (a fresh adapter id / reload each time)
            for a in range(n):
                _train(team, a)
            engine.sync(None)
            got, want = _engine(team, n, engine), _hf(team, n)
            assert [s.completion_ids for s in got] == [s.completion_ids for s in want], round_
        assert [s.completion_ids for s in got] != [s.completion_ids for s in first]  # training changed the tokens
        if layout == "lora":  # a saved snapshot (the history comparator's) is served from this engine, frozen
            from comlrl_lightning.comparators.local import load_snapshot, served_snapshot

            team.engine = engine  # the snapshot is served by the team's own engine
            team.save(tmp_path / "snap")
            for a in range(n):
                _train(team, a)
            engine.sync(None)
            snapshot = served_snapshot(team, tmp_path / "snap")
            assert snapshot is not None and snapshot.engine.name == "vllm-snapshot"
            want = [HFEngine(load_snapshot(tmp_path / "snap", n)).sample(a, PROMPTS, 1, GREEDY, SamplingStream(a))
                    for a in range(n)]
            from_snapshot = _engine(snapshot, n, snapshot.engine)
            served = [s.completion_ids for s in from_snapshot]
            assert served == [s.completion_ids for s in want]
            # each sample names the adapter folder vLLM read (what the history comparator checks)
            assert [s.source for s in from_snapshot] == [str(tmp_path / "snap" / f"agent_{a}") for a in range(n)]
            live = [s.completion_ids for s in _engine(team, n, engine)]
            assert live == [s.completion_ids for s in _hf(team, n)] and live != served
            snapshot.engine.close()
        # sampling is reproducible from the stream, and rows of one call are not copies of each other
        settings = SamplingSettings(max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=None)
        x = engine.sample(0, PROMPTS, 3, settings, SamplingStream(7))
        y = engine.sample(0, PROMPTS, 3, settings, SamplingStream(7))
        # the same tokens; vLLM's CPU kernels may round the reported log-probs differently from call to call
        assert dataclasses.replace(x, logprobs=None) == dataclasses.replace(y, logprobs=None)
        flat_x, flat_y = ([v for row in s.logprobs for c in row for v in c] for s in (x, y))
        assert len(flat_x) == len(flat_y) and max(abs(a - b) for a, b in zip(flat_x, flat_y)) < 1e-3
        assert len({tuple(c) for row in x.completion_ids for c in row}) > 1
        if layout == "full":  # engine death: the next call names the engine
            import psutil

            for child in psutil.Process().children(recursive=True):
                if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                    os.kill(child.pid, signal.SIGKILL)
            with pytest.raises(EngineError, match=r"The vLLM engine for agent 0 .* died"):
                engine.sample(0, PROMPTS, 1, GREEDY, SamplingStream(0))
    finally:
        engine.close()
    kids, shm = _leftovers(shm_before)
    assert kids == [] and shm == []


def test_unsupported_head_size_is_refused_at_engine_start(tiny_model_dir):
    team = build_agents(tiny_model_dir, num_agents=1)  # hidden 64 / 4 heads = head size 16
    engine = VLLMEngine(team, SMALL_KV)
    with pytest.raises(ValueError, match=r"attention head size 16 .* supported head sizes: 32, 64"):
        engine.sample(0, PROMPTS, 1, GREEDY, SamplingStream(0))
    assert not engine.started


def test_magrpo_fit_with_vllm_then_clean_shutdown(vllm_model_dir):
    from comlrl_lightning.config import MAGRPOConfig
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    shm_before = set(os.listdir("/dev/shm"))
    args = MAGRPOConfig(num_train_epochs=1, num_generations=2, max_new_tokens=6, temperature=1.0, top_p=1.0,
                        top_k=None, agent_learning_rate=1e-2, eval_interval=0, eval_num_samples=1, logging_steps=1,
                        rollout_buffer_size=1, generation_backend="vllm", vllm_kwargs=SMALL_KV)
    trainer = MAGRPOTrainer(agent_model=vllm_model_dir, train_dataset=ITEMS[:3], reward_func=cooperative_reward,
                            formatters=FORMATTERS, args=args, lora={"r": 8, "lora_alpha": 16},
                            trainer_kwargs=cpu_trainer_kwargs())
    engine = trainer.module.team.engine
    assert isinstance(engine, VLLMEngine)
    trainer.train()
    assert trainer.trainer.global_step > 0 and trainer.module.optimizer_steps > 0
    assert not engine.started  # closed at the end of fit
    kids, shm = _leftovers(shm_before)
    assert kids == [] and shm == []


def test_madpo_fit_with_vllm_and_ctrl_c_shuts_the_engine_down(vllm_model_dir):
    from comlrl_lightning.config import MADPOConfig
    from comlrl_lightning.trainers.preference import MADPOTrainer

    shm_before = set(os.listdir("/dev/shm"))
    args = MADPOConfig(num_train_epochs=1, preference_num_candidates=4, preference_pairs_per_sample=2,
                       max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2,
                       train_batch_size=4, eval_interval=0, eval_num_samples=2, generation_backend="vllm",
                       vllm_kwargs=SMALL_KV)
    trainer = MADPOTrainer(agent_model=vllm_model_dir, train_dataset=ITEMS, reward_func=cooperative_reward,
                           formatters=FORMATTERS, args=args, lora={"r": 8, "lora_alpha": 16},
                           trainer_kwargs=cpu_trainer_kwargs())
    engine = trainer.module.team.engine
    trainer.train()
    assert trainer.trainer.global_step > 0
    assert not engine.started
    # Ctrl-C during the next fit's collection: Lightning catches it and exits; the engine is shut down first
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return cooperative_reward(*args, **kwargs)

    trainer2 = MADPOTrainer(agent_model=vllm_model_dir, train_dataset=ITEMS, reward_func=interrupted,
                            formatters=FORMATTERS, args=args, lora={"r": 8, "lora_alpha": 16},
                            trainer_kwargs=cpu_trainer_kwargs())
    with pytest.raises(SystemExit):
        trainer2.train()
    assert engine.started is False and trainer2.module.team.engine.started is False
    kids, shm = _leftovers(shm_before)
    assert kids == [] and shm == []
