"""``validate`` / ``test`` evaluate with the seed and samples per item that the run's TaskRewardEvaluation hands the
module in its ``setup`` (``use_evaluation_settings``), so that ``validate`` reproduces the ``after`` number of
``fit``; without that callback, and after it is torn down, with the defaults (12345, 1)."""

from __future__ import annotations

import lightning as L
import pytest
from conftest import cpu_trainer_kwargs

from comlrl_lightning.callbacks import TaskRewardEvaluation
from comlrl_lightning.config import MADPOConfig
from comlrl_lightning.data.task import TaskDataModule
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.modules.madpo import MADPOModule

ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "owls")]


@pytest.fixture()
def parts(tiny_model_dir, monkeypatch):
    module = MADPOModule(agent_model=tiny_model_dir, args=MADPOConfig(max_new_tokens=2, eval_num_samples=2))
    calls = []

    def evaluate(items, task, seed=12345, samples_per_item=1):
        calls.append((len(items), seed, samples_per_item))
        return {"eval/reward_mean": 0.5}

    monkeypatch.setattr(module, "evaluate", evaluate)
    dm = TaskDataModule(train_dataset=ITEMS, eval_dataset=ITEMS, reward_func=cooperative_reward, formatters=FORMATTERS)
    return module, dm, calls


@pytest.mark.parametrize("stage", ["validate", "test"])
def test_the_evaluation_callback_hands_its_settings_and_takes_them_back(parts, stage):
    module, dm, calls = parts
    callback = TaskRewardEvaluation(samples_per_item=3, seed=7)
    metrics = getattr(L.Trainer(callbacks=[callback], **cpu_trainer_kwargs()), stage)(module, datamodule=dm)
    assert calls == [(2, 7, 3)]
    assert metrics[0][f"{'val' if stage == 'validate' else 'test'}/reward_mean"] == 0.5
    assert module.evaluation_settings == (12345, 1)  # handed back in teardown
    getattr(L.Trainer(**cpu_trainer_kwargs()), stage)(module, datamodule=dm)
    assert calls[-1] == (2, 12345, 1)


def test_settings_a_facade_changes_after_building_the_callback_are_the_ones_handed(parts):
    """The MAGRPO facades set ``evaluation.samples_per_item`` after building the callback: read at ``setup``."""
    module, dm, calls = parts
    callback = TaskRewardEvaluation()
    callback.samples_per_item, callback.seed = 8, 11
    L.Trainer(callbacks=[callback], **cpu_trainer_kwargs()).validate(module, datamodule=dm)
    assert calls == [(2, 11, 8)]


def test_the_module_takes_settings_through_its_documented_method(parts):
    module, dm, calls = parts
    module.use_evaluation_settings(seed=5, samples_per_item=2)
    L.Trainer(**cpu_trainer_kwargs()).validate(module, datamodule=dm)
    assert calls == [(2, 5, 2)]
