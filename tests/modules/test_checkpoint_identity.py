"""A checkpoint of another trainer family or team layout is refused by name before Lightning loads its weights."""

from __future__ import annotations

import pytest
from conftest import cpu_trainer_kwargs

from comlrl_lightning.config import IACConfig, MAGRPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.trainers.actor_critic import IACTrainer
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread")]
SMALL = {"num_train_epochs": 1, "max_new_tokens": 2, "eval_interval": 0, "eval_num_samples": 1}


def magrpo(model_dir, lora=None):
    return MAGRPOTrainer(agent_model=model_dir, train_dataset=ITEMS, eval_dataset=None, reward_func=cooperative_reward,
                         formatters=FORMATTERS, args=MAGRPOConfig(num_generations=2, **SMALL), lora=lora,
                         trainer_kwargs=cpu_trainer_kwargs(max_epochs=2))


def test_another_family_or_layout_is_refused_naming_what_differs(tiny_model_dir, tmp_path):
    first = magrpo(tiny_model_dir)
    first.train()
    ckpt = tmp_path / "magrpo.ckpt"
    first.trainer.save_checkpoint(ckpt)
    iac = IACTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, eval_dataset=None, reward_func=cooperative_reward,
                     formatters=FORMATTERS, args=IACConfig(**SMALL), trainer_kwargs=cpu_trainer_kwargs(max_epochs=2))
    with pytest.raises(ValueError, match=r"belongs to another run \(module: checkpoint 'MAGRPOModule', this run "
                                         r"'ActorCriticModule'"):
        iac.trainer.fit(iac.module, datamodule=iac.datamodule, ckpt_path=str(ckpt))
    lora = magrpo(tiny_model_dir, lora={"r": 4, "lora_alpha": 8})
    with pytest.raises(ValueError, match=r"lora: checkpoint False, this run True"):
        lora.trainer.fit(lora.module, datamodule=lora.datamodule, ckpt_path=str(ckpt))
    same = magrpo(tiny_model_dir)  # the same run resumes
    same.trainer.fit(same.module, datamodule=same.datamodule, ckpt_path=str(ckpt))
    assert same.trainer.current_epoch == 2
