"""TeamModuleBase, the base of the team modules: the injectable per-agent optimizer and scheduler (IAC/MAAC took
them over from MADPO/MAGRPO), from Python and from a YAML config, and the shared progress state."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from comlrl_lightning.config.actor_critic import IACConfig, MAACConfig
from comlrl_lightning.modules.actor_critic import ActorCriticModule
from comlrl_lightning.modules.base import TeamModuleBase
from comlrl_lightning.modules.madpo import MADPOModule

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"max_new_tokens": 4, "agent_learning_rate": 1e-2, "critic_learning_rate": 3e-3, "num_train_epochs": 1,
         "eval_interval": 0}


def _kinds(optimizers):
    return [(type(o).__name__, o.param_groups[0]["lr"]) for o in optimizers]


def test_iac_optimizer_factory_drives_the_actors_and_the_critics_keep_adamw(tiny_model_dir):
    m = ActorCriticModule(agent_model=tiny_model_dir, args=IACConfig(**SMALL),
                          optimizer=functools.partial(torch.optim.SGD, lr=0.05),
                          lr_scheduler=functools.partial(torch.optim.lr_scheduler.StepLR, step_size=7))
    assert isinstance(m, TeamModuleBase)
    optimizers, schedulers = m.configure_optimizers()
    assert _kinds(optimizers) == [("SGD", 0.05), ("SGD", 0.05), ("AdamW", 3e-3), ("AdamW", 3e-3)]
    assert [s["scheduler"].optimizer for s in schedulers] == optimizers[:2]
    assert schedulers[0]["scheduler"].step_size == 7
    assert [s["name"] for s in schedulers] == ["lr-agent0", "lr-agent1"]
    # the attached value heads are trained by their actor's optimizer
    heads = ActorCriticModule(agent_model=tiny_model_dir, args=IACConfig(use_separate_critic=False, **SMALL),
                              optimizer=functools.partial(torch.optim.SGD, lr=0.05))
    opts = heads.configure_optimizers()
    assert _kinds(opts) == [("SGD", 0.05), ("SGD", 0.05)]
    head_ids = {id(p) for p in heads.value_heads[1].parameters()}
    assert head_ids <= {id(p) for p in opts[1].param_groups[0]["params"]}
    # default: AdamW at agent_learning_rate
    assert _kinds(ActorCriticModule(agent_model=tiny_model_dir, args=MAACConfig(**SMALL)).configure_optimizers()) \
        == [("AdamW", 1e-2), ("AdamW", 1e-2), ("AdamW", 3e-3)]


@pytest.mark.parametrize("method", ["iac", "maac"])
def test_optimizer_from_the_yaml_config_reaches_configure_optimizers(method, tmp_path, monkeypatch):
    import lightning as L
    from lightning.pytorch.cli import LightningCLI

    monkeypatch.chdir(tmp_path)
    cli = LightningCLI(L.LightningModule, L.LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                  auto_configure_optimizers=False, save_config_callback=None, run=False,
                  args=["--config", str(ROOT / f"configs/{method}/tiny.yaml"),
                        "--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.lr=0.05",
                        "--model.init_args.optimizer.momentum=0.5"])
    optimizers = cli.model.configure_optimizers()
    assert _kinds(optimizers[:2]) == [("SGD", 0.05), ("SGD", 0.05)]
    assert optimizers[0].param_groups[0]["momentum"] == 0.5
    assert {type(o).__name__ for o in optimizers[2:]} == {"AdamW"}  # critics: critic_learning_rate


def test_progress_state_round_trip(tiny_model_dir):
    m = MADPOModule(agent_model=tiny_model_dir)
    m.env_step, m.updates_seen, m.round_index = 12, 5, 2
    ckpt: dict = {}
    m.on_save_checkpoint(ckpt)
    assert ckpt["comlrl_progress"] == {"env_step": 12, "updates_seen": 5, "round_index": 2}
    fresh = MADPOModule(agent_model=tiny_model_dir)
    fresh.on_load_checkpoint(ckpt)
    assert (fresh.env_step, fresh.updates_seen, fresh.round_index) == (12, 5, 2)


def test_learning_rates_are_logged_per_agent(tiny_model_dir, tmp_path):
    """LearningRateMonitor logs each agent's learning rate under lr-agent{i} (not lr-AdamW-1)."""
    import lightning as L
    from conftest import cpu_trainer_kwargs
    from lightning.pytorch.callbacks import LearningRateMonitor

    from comlrl_lightning.callbacks import PreferenceCollection
    from comlrl_lightning.config import MADPOConfig
    from comlrl_lightning.data.madpo import PreferenceDataModule
    from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward

    small = {k: v for k, v in SMALL.items() if k != "critic_learning_rate"}
    args = MADPOConfig(**small, preference_num_candidates=2, preference_pairs_per_sample=1, train_batch_size=4)
    module = MADPOModule(agent_model=tiny_model_dir, args=args,
                         lr_scheduler=functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5))
    dm = PreferenceDataModule(train_dataset="builtin:cooperative", eval_dataset=None, reward_func=cooperative_reward,
                              formatters=FORMATTERS, num_agents=2)
    monitor = LearningRateMonitor()
    trainer = L.Trainer(callbacks=[PreferenceCollection(), monitor], max_steps=4,
                        **cpu_trainer_kwargs(default_root_dir=str(tmp_path), logger=True))
    trainer.fit(module, datamodule=dm)
    assert set(monitor.lrs) == {"lr-agent0", "lr-agent1"}


def test_every_public_config_loads_from_a_weights_only_checkpoint(tmp_path):
    """Each module saves its ``args`` in the checkpoint and Lightning resumes ``weights_only``: every public config
    dataclass must be allow-listed (MAGRPO's were not, once), and the list must not miss a config added later."""
    import dataclasses

    import comlrl_lightning.config as config
    import comlrl_lightning.modules  # noqa: F401 - registers the allow-list

    public = {getattr(config, name) for name in config.__all__
              if name.endswith("Config") and dataclasses.is_dataclass(getattr(config, name))}
    assert public == set(config.CONFIG_CLASSES)
    for cls in config.CONFIG_CLASSES:
        torch.save({"hyper_parameters": {"args": cls()}}, tmp_path / "c.pt")
        loaded = torch.load(tmp_path / "c.pt", weights_only=True)["hyper_parameters"]["args"]
        assert loaded == cls(), cls.__name__
