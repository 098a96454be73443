"""TaskRewardEvaluation keeps its evaluations in checkpoints: after a resume, "before" is still the first run's."""

from __future__ import annotations

import torch


def test_evaluation_history_round_trips_through_a_weights_only_checkpoint(tmp_path):
    from comlrl_lightning.callbacks import TaskRewardEvaluation

    first = TaskRewardEvaluation()
    first.history = [(0, {"eval/reward_mean": 0.25}), (8, {"eval/reward_mean": 0.5})]
    torch.save({"callbacks": {first.state_key: first.state_dict()}}, tmp_path / "c.ckpt")
    state = torch.load(tmp_path / "c.ckpt", weights_only=True)["callbacks"][first.state_key]
    resumed = TaskRewardEvaluation()
    resumed.load_state_dict(state)
    resumed.history.append((16, {"eval/reward_mean": 0.75}))
    assert resumed.before_after == (0.25, 0.75)
