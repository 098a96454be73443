"""``parallel_training="mp"``: each member on its own device inside one process (docs/architecture.md, "Devices").

On a CPU machine every real device is ``cpu``, so re-placement after Lightning's ``module.to(root)`` is shown with
the ``meta`` device standing in for a second one; ``test_placement_gpu.py`` runs the same on two GPUs."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from conftest import cpu_trainer_kwargs

from comlrl_lightning.config import IACConfig, MADPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.modules.actor_critic import IACModule
from comlrl_lightning.modules.madpo import MADPOModule
from comlrl_lightning.trainers.actor_critic import IACTrainer
from comlrl_lightning.trainers.preference import MADPOTrainer

ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]
TINY = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2, eval_interval=0,
            eval_num_samples=2)


def _unchecked(args, **changes):
    """``args`` with ``changes`` set without the constructor's checks (to name a stand-in device)."""
    out = copy.copy(args)
    for key, value in changes.items():
        object.__setattr__(out, key, value)  # the configs check assignments too
    return out


def test_members_go_back_to_their_devices_after_module_to(tiny_model_dir):
    module = MADPOModule(agent_model=tiny_model_dir, args=MADPOConfig(parallel_training="mp",
                                                                      agent_devices=["cpu", "cpu"], **TINY))
    module.args = _unchecked(module.args, agent_devices=["cpu", "meta"])
    module.to("cpu")  # what Lightning's strategy does at setup
    assert module.agent_device(0) == torch.device("cpu") and module.agent_device(1) == torch.device("meta")
    module.args = _unchecked(module.args, parallel_training="none")
    assert module.member_placement() == []  # without "mp", .to moves everything as usual


def test_mp_inside_a_multi_process_strategy_is_refused(tiny_model_dir):
    module = MADPOModule(agent_model=tiny_model_dir, args=MADPOConfig(parallel_training="mp", agent_devices="cpu",
                                                                      **TINY))
    module._trainer = SimpleNamespace(world_size=2, strategy=SimpleNamespace())
    with pytest.raises(ValueError, match=r"parallel_training='mp' .* the trainer runs 2 processes"):
        module.place_members()


def test_lora_agents_on_different_devices_are_refused(tiny_model_dir):
    module = MADPOModule(agent_model=tiny_model_dir, lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]},
                         args=MADPOConfig(parallel_training="mp", agent_devices="cpu", **TINY))
    module.args = _unchecked(module.args, agent_devices=["cpu", "meta"])
    with pytest.raises(ValueError, match="LoRA agents on different devices"):
        module.member_placement()


def test_actor_critic_places_critics_and_value_heads(tiny_model_dir):
    args = IACConfig(num_generations=2, parallel_training="mp", agent_devices="cpu", critic_devices=["cpu", "cpu"],
                     **TINY)
    module = IACModule(agent_model=tiny_model_dir, critic_model=tiny_model_dir, args=args)
    placed = module.member_placement()
    assert len(placed) == 2 + len(module.value_heads) + len(module.critics) and len(module.critics) == 2
    module.args = _unchecked(module.args, critic_devices=["cpu", "meta"])
    module.to("cpu")
    assert next(module.critics[1].parameters()).device == torch.device("meta")
    assert module.agent_device(1) == torch.device("cpu")


def test_mp_fits_end_to_end_on_cpu_devices(tiny_model_dir):
    madpo = MADPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=cooperative_reward,
                         formatters=FORMATTERS, trainer_kwargs=cpu_trainer_kwargs(),
                         args=MADPOConfig(num_train_epochs=1, preference_num_candidates=4, train_batch_size=4,
                                          parallel_training="mp", agent_devices=["cpu", "cpu"], **TINY))
    before = [p.detach().clone() for p in madpo.team.parameters_of(1)]
    madpo.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, madpo.team.parameters_of(1)))
    iac = IACTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS[:2], reward_func=cooperative_reward,
                     formatters=FORMATTERS, trainer_kwargs=cpu_trainer_kwargs(),
                     args=IACConfig(num_generations=2, num_train_epochs=1, parallel_training="mp",
                                    agent_devices="cpu", critic_devices="cpu", **TINY))
    iac.train()
    assert iac.env_step > 0
