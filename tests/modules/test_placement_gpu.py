"""``parallel_training="mp"`` on two GPUs: agents on cuda:0 and cuda:1 train and sample (skipped without 2 GPUs)."""

from __future__ import annotations

import pytest
import torch
from conftest import cpu_trainer_kwargs

from comlrl_lightning.config import IACConfig, MADPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.trainers.actor_critic import IACTrainer
from comlrl_lightning.trainers.preference import MADPOTrainer

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]
ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]
TINY = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2, eval_interval=0,
            eval_num_samples=2, parallel_training="mp", agent_devices=["cuda:0", "cuda:1"])


def test_madpo_agents_train_on_their_own_gpus(tiny_model_dir):
    tr = MADPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=cooperative_reward,
                      formatters=FORMATTERS, trainer_kwargs=cpu_trainer_kwargs(accelerator="gpu", devices=[0]),
                      args=MADPOConfig(num_train_epochs=1, preference_num_candidates=4, train_batch_size=4, **TINY))
    before = [p.detach().clone() for p in tr.team.parameters_of(1)]
    tr.train()
    assert [tr.module.agent_device(i) for i in range(2)] == [torch.device("cuda:0"), torch.device("cuda:1")]
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.team.parameters_of(1)))


def test_iac_critics_follow_critic_devices(tiny_model_dir):
    tr = IACTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS[:2], reward_func=cooperative_reward,
                    formatters=FORMATTERS, trainer_kwargs=cpu_trainer_kwargs(accelerator="gpu", devices=[0]),
                    args=IACConfig(num_generations=2, num_train_epochs=1, critic_devices=["cuda:1", "cuda:0"], **TINY))
    tr.train()
    assert [next(c.parameters()).device for c in tr.module.critics] == [torch.device("cuda:1"), torch.device("cuda:0")]


def test_agents_on_two_gpus_generate_at_the_same_time_with_the_sequential_results(tiny_model_dir):
    """agent_overlap="auto" with agents on cuda:0 and cuda:1: one worker per GPU, the level equals the
    sequential one, and the own-generator draw equals HF's draw from the seeded CUDA RNG."""
    from comlrl_lightning.agents import build_agents
    from comlrl_lightning.engines import HFEngine, SampleRequest
    from comlrl_lightning.generation import SamplingSettings, SamplingStream, sample_completions

    team = build_agents(tiny_model_dir, num_agents=2)
    for i, model in enumerate(team.models):
        model.to(f"cuda:{i}")
    settings = SamplingSettings(max_new_tokens=8, temperature=1.0, top_p=0.9, top_k=20)
    prompts = ["Topic: rivers.", "Topic: chess."]

    def requests():
        return [SampleRequest(a, prompts, 3, SamplingStream(40 + a)) for a in range(2)]

    auto = HFEngine(team)
    assert auto.workers(requests(), settings) == [[0], [1]]
    assert auto.sample_many(requests(), settings) == HFEngine(team, overlap="off").sample_many(requests(), settings)
    model, tok = team.models[1], team.tokenizers[1]
    own = sample_completions(model, tok, prompts, 3, settings, SamplingStream(5), own_generator=True)
    assert own == sample_completions(model, tok, prompts, 3, settings, SamplingStream(5), own_generator=False)


def test_magrpo_updates_on_two_gpus_overlap_and_match_the_sequential_fit(tiny_model_dir, monkeypatch):
    """agent_overlap="auto" with agents on cuda:0 and cuda:1: the updates run in one worker per GPU and end with
    the weights of agent_overlap="off" (close, not bit-equal: CUDA's embedding backward adds atomically)."""
    import threading

    import comlrl_lightning.overlap as overlap
    from comlrl_lightning.config import MAGRPOConfig
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    names = []

    class Recording(overlap._Handover):
        def __init__(self, *args, **kwargs):
            names.append(threading.current_thread().name)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(overlap, "_Handover", Recording)

    def fit(mode):
        tr = MAGRPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS[:2], reward_func=cooperative_reward,
                           formatters=FORMATTERS, trainer_kwargs=cpu_trainer_kwargs(accelerator="gpu", devices=[0]),
                           args=MAGRPOConfig(num_generations=2, num_train_epochs=1, rollout_buffer_size=1,
                                             agent_overlap=mode, **TINY))
        tr.train()
        return [p.detach().cpu() for i in range(2) for p in tr.team.parameters_of(i)]

    auto = fit("auto")
    assert any(n.startswith("agent-update-") for n in names)
    off = fit("off")
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(auto, off))
