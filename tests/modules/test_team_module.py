"""TeamModuleBase, the base of the team modules: the injectable per-agent optimizer and scheduler (IAC/MAAC took
them over from MADPO/MAGRPO), from Python and from a YAML config, and the shared progress state."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from comlrl_lightning.config_ac import IACConfig, MAACConfig
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
    assert [s.optimizer for s in schedulers] == optimizers[:2] and schedulers[0].step_size == 7
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
