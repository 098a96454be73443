"""MARLHF's learned reward model under FSDP2 (docs/scaling.md, "FSDP2"): sharded after its fit like a frozen reference,
its scoring calls balanced over the ranks; the fit ends with the weights of strategy="ddp" from the same seed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": str(TESTS.parent), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


@pytest.mark.slow
def test_fsdp2_marlhf_shards_the_reward_model_and_equals_ddp(tiny_model_dir, tmp_path):
    """On 2 gloo processes, offline MARLHF (MAGRPO and IAC as the RL stage) and MARLHFIter (2 rounds, 3 items, round 1
    scored by round 0's reward model: rank 0 scores more joint responses than rank 1 in the collection) under
    ModelParallelStrategy: the reward
    model's backbone is a DTensor, half of it on each rank, it gives the rewards of strategy="ddp" and the agents
    end with ddp's weights."""
    out = subprocess.run([sys.executable, str(TESTS / "fsdp_marlhf_script.py"), str(tmp_path), tiny_model_dir,
                          "marlhf", "marlhf_iac", "marlhf_iter"], capture_output=True, text=True, timeout=900, env=ENV, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for name, fits in (("marlhf", 1), ("marlhf_iac", 1), ("marlhf_iter", 2)):
        ddp, fsdp = ranks[0][f"{name}/ddp"], ranks[0][f"{name}/fsdp2"]
        assert fsdp["world"] == 2 and fsdp["global_step"] == ddp["global_step"] > 0 and fsdp["fits"] == fits
        assert fsdp["rm_type"] == "DTensor" and ddp["rm_type"] == "Parameter", name
        assert ranks[1][f"{name}/ddp"]["rm_local"] == ddp["rm_numel"]  # DDP: whole on each rank
        for r in (0, 1):  # FSDP2: half of the backbone per rank (its 65-number head stays whole)
            assert ranks[r][f"{name}/fsdp2"]["rm_local"] == fsdp["rm_numel"] // 2, (name, r)
            assert torch.equal(ranks[r][f"{name}/fsdp2"]["rm_weights"], ddp["rm_weights"]), name
            assert ranks[r][f"{name}/fsdp2"]["rewards"] == ranks[r][f"{name}/ddp"]["rewards"], name
        assert len(fsdp["rewards"]) > 0
        if name == "marlhf_iter":  # the 2 + 1 split of the collection: fewer scoring calls on rank 1
            assert len(ranks[0][f"{name}/fsdp2"]["rewards"]) > len(ranks[1][f"{name}/fsdp2"]["rewards"])
        for before, a, b in zip(fsdp["initial"], ddp["weights"], fsdp["weights"]):
            assert not torch.equal(before, b), f"{name}: an agent did not train"
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=f"{name}: FSDP2 differs from strategy=ddp")


def test_reward_model_device_is_refused_under_fsdp2():
    """The mesh places the sharded reward model: reward_model_device is refused naming its value."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from comlrl_lightning.sharding import shard_team

    module = SimpleNamespace(reference=None, _trainer=SimpleNamespace(strategy=ModelParallelStrategy()),
                             args=SimpleNamespace(parallel_training="none", generation_backend="hf",
                                                  reward_model_device="cuda:1"))
    with pytest.raises(ValueError, match=r"reward_model_device='cuda:1' with ModelParallelStrategy"):
        shard_team(module)


def test_reward_model_is_not_sharded_outside_model_parallel():
    from comlrl_lightning.sharding import shard_reward_model

    model = SimpleNamespace(backbone=torch.nn.Linear(2, 2))
    assert shard_reward_model(model, SimpleNamespace(strategy=object())) is False
    assert shard_reward_model(model, None) is False and not hasattr(model, "score")


def test_reward_model_fit_under_fsdp2_is_refused_with_a_pointer(tiny_model_dir, tmp_path):
    """A JointRewardModel fit of its own under ModelParallelStrategy gets our message, not Lightning's request to
    implement configure_model."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from comlrl_lightning.config.reward_model import RewardModelOptions
    from comlrl_lightning.modules.reward_model import JointRewardModel, fit_reward_model
    from comlrl_lightning.preferences import PreferencePair

    pairs = [PreferencePair(["a", "b"], [f"good {i}", "yes"], ["bad", "no"], 1.0, 0.0, 0.5) for i in range(2)]
    model = JointRewardModel(tiny_model_dir, args=RewardModelOptions(reward_train_batch_size=2), num_agents=2, seed=0)
    kwargs = dict(accelerator="cpu", devices=1, strategy=ModelParallelStrategy(), logger=False,
                  enable_checkpointing=False, enable_progress_bar=False, default_root_dir=tmp_path)
    try:
        with pytest.raises(ValueError, match=r"JointRewardModel fit with ModelParallelStrategy .* MARLHFTrainer"):
            fit_reward_model(model, pairs, trainer_kwargs=kwargs)
    finally:  # the strategy set up a 1-process group in this process: leave none to the next tests
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
