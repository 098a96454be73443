"""ExportAgents saves MARLHF's learned reward model (the module's training oracle) into the run folder."""

from __future__ import annotations

from types import SimpleNamespace

import torch


def test_learned_reward_model_is_exported_to_the_run_folder(tiny_model_dir, tmp_path):
    from comlrl_lightning.callbacks import ExportAgents
    from comlrl_lightning.modules.reward_model import JointRewardModel
    from comlrl_lightning.reward_model import LearnedRewardOracle

    reward_model = JointRewardModel(tiny_model_dir, seed=0)
    module = SimpleNamespace(train_oracle=LearnedRewardOracle(reward_model))  # what LearnedRewardFit hands over
    trainer = SimpleNamespace(is_global_zero=True, log_dir=str(tmp_path / "version_3"), default_root_dir="unused")
    callback = ExportAgents()
    callback.on_train_end(trainer, module)
    folder = tmp_path / "version_3" / "reward_model"
    assert callback.exported["reward_model"] == str(folder)
    head = torch.load(folder / "head.pt", weights_only=True)
    assert torch.equal(head["weight"], reward_model.head.weight.detach())
    again = JointRewardModel(str(folder / "backbone"), seed=1)
    again.head.load_state_dict(head)
    texts = ["a joint answer"]
    assert torch.allclose(again(texts), reward_model(texts), atol=1e-5)


def test_length_aware_head_is_exported_with_num_agents(tiny_model_dir, tmp_path):
    import json

    from comlrl_lightning.config.reward_model import RewardModelOptions
    from comlrl_lightning.modules.reward_model import JointRewardModel

    model = JointRewardModel(tiny_model_dir, args=RewardModelOptions(reward_length_features="add"), num_agents=2)
    with torch.no_grad():
        model.length_head.weight.fill_(0.5)
    folder = model.save_reward_model(tmp_path / "rm")
    saved = torch.load(folder / "length_head.pt")
    assert torch.equal(saved["weight"], model.length_head.weight.detach())
    meta = json.loads((folder / "reward_model.json").read_text())
    assert meta["num_agents"] == 2 and meta["options"]["reward_length_features"] == "add"
