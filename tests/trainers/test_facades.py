"""Every facade follows the same rules: team size, args type, Trainer settings, the shared TeamTrainer API."""

from __future__ import annotations

import pytest
from conftest import cpu_trainer_kwargs

from comlrl_lightning.agents import load_tokenizer
from comlrl_lightning.config import MADPOConfig, MADPOIterConfig
from comlrl_lightning.config.actor_critic import IACConfig, MAACConfig
from comlrl_lightning.config.magrpo import MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig
from comlrl_lightning.config.marlhf import MARLHFConfig, MARLHFIterConfig
from comlrl_lightning.trainers.actor_critic import IACTrainer, MAACTrainer
from comlrl_lightning.trainers.base import TeamTrainer
from comlrl_lightning.trainers.madpo import MADPOIterTrainer
from comlrl_lightning.trainers.marlhf import MARLHFIterTrainer, MARLHFTrainer
from comlrl_lightning.trainers.preference import MADPOTrainer
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer, MAREINFORCETrainer, MAReMaxTrainer, MARLOOTrainer

ITEMS = [{"prompt": "Say hi."}, {"prompt": "Say bye."}]
SMALL = {"num_train_epochs": 1, "max_new_tokens": 4, "eval_num_samples": 1}

# facade -> (its config class, the options that keep it small)
WITH_NUM_AGENTS = {
    MADPOTrainer: (MADPOConfig, {}),
    MADPOIterTrainer: (MADPOIterConfig, {"num_iterations": 1}),
    MAGRPOTrainer: (MAGRPOConfig, {"num_generations": 2, "num_turns": 1}),
    MAREINFORCETrainer: (MAREINFORCEConfig, {"num_generations": 2, "num_turns": 1}),
    MARLOOTrainer: (MARLOOConfig, {"num_generations": 2, "num_turns": 1}),
    MAReMaxTrainer: (MAReMaxConfig, {"num_generations": 2, "num_turns": 1}),
    MARLHFTrainer: (MARLHFConfig, {}),
    MARLHFIterTrainer: (MARLHFIterConfig, {"num_iterations": 1}),
}
ACTOR_CRITIC = {IACTrainer: (IACConfig, {"num_turns": 1}), MAACTrainer: (MAACConfig, {"num_turns": 1})}
ALL = {**WITH_NUM_AGENTS, **ACTOR_CRITIC}


def reward(*completions, **_):
    return [1.0] * len(completions[0])


def make_args(cls, **kw):
    config_cls, extra = ALL[cls]
    return config_cls(**{**SMALL, **extra, **kw})


def build(cls, args=None, **kw):
    return cls(train_dataset=ITEMS, reward_func=reward, args=args if args is not None else make_args(cls),
               trainer_kwargs=cpu_trainer_kwargs(), **kw)


def test_every_facade_is_a_team_trainer_with_its_default_config():
    for cls, (config_cls, _) in ALL.items():
        assert issubclass(cls, TeamTrainer)
        assert cls.config_cls is config_cls
        for name in ("team", "env_step", "train", "save_model"):
            assert getattr(cls, name) is getattr(TeamTrainer, name), (cls.__name__, name)


# --- num_agents: one rule ----------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", list(WITH_NUM_AGENTS), ids=lambda c: c.__name__)
def test_explicit_num_agents_must_match_args(cls, tiny_model_dir):
    # Upstream MAGRPO let num_agents override args.num_agents; every facade now rejects the disagreement.
    with pytest.raises(ValueError, match=r"num_agents \(3\) must match args.num_agents \(2\); set args.num_agents=3"):
        build(cls, agent_model=tiny_model_dir, num_agents=3)
    with pytest.raises(ValueError, match=r"agents length \(3\) must match num_agents \(2\)"):
        build(cls, agents=[tiny_model_dir] * 3, num_agents=2)


@pytest.mark.parametrize("cls", list(WITH_NUM_AGENTS), ids=lambda c: c.__name__)
def test_team_size_comes_from_agents_or_args(cls, tiny_model_dir):
    tr = build(cls, agents=[tiny_model_dir] * 3)  # agents alone: N = len(agents)
    assert tr.args.num_agents == 3 and tr.team.num_agents == 3
    tr = build(cls, agent_model=tiny_model_dir, args=make_args(cls, num_agents=1), num_agents=1)
    assert tr.args.num_agents == 1 and tr.team.num_agents == 1
    tr = build(cls, agent_model=tiny_model_dir, args=make_args(cls, num_agents=1))  # agent_model alone: args
    assert tr.args.num_agents == 1 and tr.team.num_agents == 1


@pytest.mark.parametrize("cls", list(ACTOR_CRITIC), ids=lambda c: c.__name__)
def test_actor_critic_team_size_is_always_args(cls, tiny_model_dir):
    # CoMLRL's IAC/MAAC take no num_agents; an agents list of another length is an error, not a new size.
    args = make_args(cls)
    with pytest.raises(ValueError, match="args.num_agents=2 but 3 agents were given"):
        build(cls, agents=[tiny_model_dir] * 3, tokenizer=load_tokenizer(tiny_model_dir), args=args)
    assert args.num_agents == 2
    tr = build(cls, agent_model=tiny_model_dir, args=make_args(cls, num_agents=1))
    assert tr.args.num_agents == 1 and tr.team.num_agents == 1


# --- args and inputs -------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", list(ALL), ids=lambda c: c.__name__)
def test_args_of_the_wrong_type_are_rejected(cls):
    wrong = IACConfig(**SMALL) if not issubclass(cls, (IACTrainer, MAACTrainer)) else MAGRPOConfig(**SMALL)
    with pytest.raises(TypeError, match=f"{cls.__name__} needs args of type .*; got {type(wrong).__name__}"):
        cls(agent_model="unused", train_dataset=ITEMS, reward_func=reward, args=wrong)


@pytest.mark.parametrize("cls", list(ALL), ids=lambda c: c.__name__)
def test_shared_input_checks(cls):
    with pytest.raises(ValueError, match="Either agent_model or agents must be provided"):
        cls(train_dataset=ITEMS, reward_func=reward, args=make_args(cls))
    with pytest.raises(ValueError, match="reward_func must be a callable"):
        cls(agent_model="unused", train_dataset=ITEMS, reward_func=None, args=make_args(cls))
    with pytest.raises(ValueError, match="train_dataset is required"):
        cls(agent_model="unused", reward_func=reward, args=make_args(cls))


def test_magrpo_family_accepts_any_magrpo_config(tiny_model_dir):
    tr = build(MARLOOTrainer, agent_model=tiny_model_dir, args=MAGRPOConfig(**SMALL, num_generations=2))
    assert tr.args.advantage_mode == "mean" and tr.module.algorithm_name == "MARLOO"


# --- the lightning.Trainer ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [MADPOIterTrainer, MARLHFIterTrainer], ids=lambda c: c.__name__)
def test_rounds_force_dataloader_reload_and_count_epochs(cls, tiny_model_dir):
    tr = cls(agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=reward,
             args=make_args(cls, num_iterations=3, num_train_epochs=2),
             trainer_kwargs=cpu_trainer_kwargs(reload_dataloaders_every_n_epochs=0))
    assert tr.trainer.reload_dataloaders_every_n_epochs == 1
    assert tr.trainer.max_epochs == 6


@pytest.mark.parametrize("cls", list(ALL), ids=lambda c: c.__name__)
def test_trainer_kwargs_and_callbacks_reach_the_trainer(cls, tiny_model_dir):
    import lightning as L

    class Marker(L.Callback):
        pass

    marker = Marker()
    n = 1 if cls in ACTOR_CRITIC else None
    args = make_args(cls, num_agents=1) if n else make_args(cls)
    tr = cls(agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=reward, args=args, callbacks=[marker],
             trainer_kwargs=cpu_trainer_kwargs(max_epochs=7))
    assert tr.trainer.max_epochs == 7 and marker in tr.trainer.callbacks
