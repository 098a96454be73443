"""The reward-model fit's log gives the pairs it trained on and the pairs held out for validation (issue 27 #11)."""

from __future__ import annotations

import logging

import lightning as L
from conftest import cpu_trainer_kwargs

from comlrl_lightning.config import MARLHFConfig
from comlrl_lightning.preferences import PreferencePair

TINY = {"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0, "top_k": None, "num_generations": 2,
        "preference_num_candidates": 2, "reward_num_train_epochs": 1, "reward_length_features": "only"}


def _pairs() -> list[PreferencePair]:
    return [PreferencePair([f"p{k}a", f"p{k}b"], ["short", "a much longer elaboration"], ["a long answer", "x"],
                           1.0, 0.0, 0.5) for k in (1, 1, 2, 2)]  # two prompt sets of two pairs each


def _fit_log(tiny_model_dir, caplog, val_fraction) -> str:
    from comlrl_lightning.callbacks import LearnedRewardFit
    from comlrl_lightning.modules.marlhf import MARLHFModule

    module = MARLHFModule(agent_model=str(tiny_model_dir),
                          args=MARLHFConfig(**TINY, reward_model_name=str(tiny_model_dir)))
    with caplog.at_level(logging.INFO):
        LearnedRewardFit(val_fraction=val_fraction).fit(L.Trainer(**cpu_trainer_kwargs()), module, _pairs(), seed=0)
    return next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Reward model fitted on"))


def test_the_fit_log_counts_trained_and_held_out_pairs(tiny_model_dir, caplog):
    line = _fit_log(tiny_model_dir, caplog, 0.5)  # one whole prompt set (2 pairs) held out
    assert line.startswith("Reward model fitted on 2 pairs (2 more held out for validation)"), line


def test_without_held_out_pairs_the_log_counts_every_pair(tiny_model_dir, caplog):
    line = _fit_log(tiny_model_dir, caplog, 0)
    assert line.startswith("Reward model fitted on 4 pairs (1 epoch(s))"), line
