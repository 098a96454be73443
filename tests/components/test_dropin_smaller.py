"""The smaller drop-in items of docs/coming-from-comlrl.md: the OpenAI Responses key default, reward/critic
sources inferred from model objects, one loaded copy for a repeated comparator model."""

from __future__ import annotations

from types import SimpleNamespace

from conftest import cpu_trainer_kwargs

from comlrl_lightning.agents import build_agents, load_model, load_tokenizer, loadable_name_of
from comlrl_lightning.comparators.api_formats import default_key_env
from comlrl_lightning.comparators.local import build_comparator
from comlrl_lightning.config import MADPOIterConfig, MARLHFConfig
from comlrl_lightning.modules.marlhf import default_reward_source


def test_openai_responses_reads_openai_api_key_by_default():
    assert default_key_env("openai_responses") == "OPENAI_API_KEY"
    assert default_key_env("anthropic") == "ANTHROPIC_API_KEY"
    assert default_key_env("generic") is None


def test_model_objects_carry_their_loadable_name(tiny_model_dir):
    model = load_model(tiny_model_dir)
    assert loadable_name_of(model) == tiny_model_dir
    assert default_reward_source(model, None) == tiny_model_dir
    assert default_reward_source(None, [model, model]) == tiny_model_dir


def test_marlhf_with_model_objects_needs_no_reward_or_critic_name(tiny_model_dir):
    from comlrl_lightning.trainers.marlhf import MARLHFTrainer

    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    for extra in ({}, {"rl_algorithm": "maac", "num_generations": 1}):
        args = MARLHFConfig(preference_num_candidates=2, max_new_tokens=4, **extra)
        tr = MARLHFTrainer(agents=[model, load_model(tiny_model_dir)], tokenizer=tok, reward_func=lambda a, b: [0.0],
                           train_dataset=[{"prompt": "x"}], args=args, trainer_kwargs=cpu_trainer_kwargs())
        assert tr.module is not None


def test_centralized_comparator_from_one_model_name_loads_one_copy(tiny_model_dir):
    cfg = MADPOIterConfig(comparator_policy="model", comparator_model_name=tiny_model_dir,
                          comparator_generation_mode="centralized", num_agents=3)
    comparator = build_comparator(cfg)
    live = build_agents(agent_model=tiny_model_dir, num_agents=3)
    comparator.setup(None, SimpleNamespace(team=live, args=cfg, sampling_settings=lambda: None))
    team = comparator.inner.team() if hasattr(comparator, "inner") else comparator.team()
    assert len({id(m) for m in team.models}) == 1
    assert all(not p.requires_grad for p in team.models[0].parameters())
