"""CoMLRL 1.4.3's public module paths, with the package prefix changed, import the same names
(docs/coming-from-comlrl.md, "Import paths")."""

from __future__ import annotations

import importlib

import pytest

# CoMLRL module -> the names its __init__ exports (the ones listed as refused in the docs are left out)
COMLRL_EXPORTS = {
    "comlrl.trainers": [
        "ActorCriticTrainerBase", "IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer", "MAGRPOConfig",
        "MAGRPOTrainer", "MADPOConfig", "MADPOTrainer", "MARLHFConfig", "MARLHFTrainer", "JointRewardModel",
        "MAREINFORCEConfig", "MAREINFORCETrainer", "MAReMaxConfig", "MAReMaxTrainer", "MARLOOConfig",
        "MARLOOTrainer"],
    "comlrl.trainers.preference": [
        "MADPOConfig", "MADPOTrainer", "CentralizedComparatorAdapter", "CentralizedComparatorParseError",
        "TaggedCentralizedComparatorAdapter", "MADPOIterConfig", "MADPOIterTrainer", "MARLHFConfig",
        "MARLHFTrainer", "MARLHFIterConfig", "MARLHFIterTrainer", "JointRewardModel"],
    "comlrl.trainers.reinforce": [
        "MAGRPOConfig", "MAGRPOTrainer", "MAREINFORCEConfig", "MAREINFORCETrainer", "MAReMaxConfig",
        "MAReMaxTrainer", "MARLOOConfig", "MARLOOTrainer"],
    "comlrl.trainers.actor_critic": ["ActorCriticTrainerBase", "IACConfig", "IACTrainer", "MAACConfig",
                                     "MAACTrainer"],
    "comlrl.utils": ["set_reward_range", "resolve_reward_range", "call_reward_function", "RewardProcessors",
                     "build_formatters"],
}


@pytest.mark.parametrize("module", sorted(COMLRL_EXPORTS))
def test_comlrl_module_paths_import_with_our_prefix(module):
    ours = importlib.import_module(module.replace("comlrl", "comlrl_lightning", 1))
    import comlrl_lightning

    for name in COMLRL_EXPORTS[module]:
        value = getattr(ours, name)
        if hasattr(comlrl_lightning, name):  # the same object as the package root's name
            assert value is getattr(comlrl_lightning, name), name
        assert name in ours.__all__, f"{name} missing from {ours.__name__}.__all__"


def test_the_issue_import_line_works():
    from comlrl_lightning.trainers.preference import (  # noqa: F401
        MADPOIterConfig,
        MADPOIterTrainer,
        MARLHFConfig,
        MARLHFIterConfig,
        MARLHFIterTrainer,
        MARLHFTrainer,
    )
