"""The option groups of comlrl_lightning.config: one rule and one message per option, whatever the config."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest

from comlrl_lightning.config import (
    IACConfig,
    MAACConfig,
    MADPOConfig,
    MADPOIterConfig,
    MAGRPOConfig,
    MAREINFORCEConfig,
    MAReMaxConfig,
    MARLHFConfig,
    MARLHFIterConfig,
    MARLOOConfig,
)

CONFIGS = [MADPOConfig, MADPOIterConfig, MARLHFConfig, MARLHFIterConfig, MAGRPOConfig, MAREINFORCEConfig,
           MARLOOConfig, MAReMaxConfig, IACConfig, MAACConfig]

# (option, bad value, extra options that make the check run where the config has them). Every config that has
# the option must reject the value with the same message.
SHARED_BAD = [
    ("num_train_epochs", 0, {}), ("num_train_epochs", True, {}), ("agent_learning_rate", 0.0, {}),
    ("agent_learning_rate", float("nan"), {}), ("logging_steps", 0, {}), ("num_agents", 0, {}),
    ("parallel_training", "ddp", {}), ("agent_devices", ["cpu"] * 3, {"parallel_training": "mp", "critic_devices": "cpu"}),
    ("agent_devices", [], {}), ("agent_overlap", "sometimes", {}), ("max_new_tokens", 0, {}), ("temperature", 0.0, {}), ("top_p", 1.5, {}),
    ("top_k", 0, {}), ("generation_backend", "tpu", {}), ("vllm_kwargs", ["enforce_eager"], {}), ("num_turns", 0, {}), ("discount", 1.5, {}), ("early_termination_threshold", "high", {}),
    ("eval_interval", -1, {}), ("eval_num_samples", -1, {}), ("eval_batch_size", 0, {}),
    ("rollout_buffer_size", 0, {}), ("train_batch_size", 0, {}), ("train_batch_size", 1.5, {}),
    ("reference_kl_coef", -0.1, {}), ("reference_kl_coef", float("nan"), {}), ("reference_kl_coef", None, {}),
    ("reference_devices", ["cpu"] * 3, {"reference_kl_enabled": True}), ("advantage_mode", "best", {}),
    ("joint_mode", "diagonal", {}), ("num_generations", 0, {"rl_algorithm": "iac"}),
    ("num_generations", True, {"rl_algorithm": "iac"}), ("critic_learning_rate", 0.0, {}),
    ("critic_learning_rate", float("inf"), {}), ("critic_type", "x", {}), ("value_loss_coef", 0.0, {}),
    ("value_loss_coef", -1.0, {}), ("value_clip_range", 0.0, {}), ("critic_value_head_hidden_dim", 0, {}),
    ("value_head_hidden_dim", True, {}), ("critic_devices", [], {"rl_algorithm": "iac", "num_generations": 1}),
    ("generation_batch_size", 0, {}), ("generation_batch_size", 2.5, {}), ("logprob_gap_threshold", 0, {}),
    ("logprob_gap_threshold", float("nan"), {}), ("use_chat_template", "yes", {}),
]

# Same option, deliberately different rule, per spec: MADPO is reference-free (its reference_devices are never
# used), the MAGRPO family needs >= 2 generations (two upstream sentences), and MAAC has no fallback for
# critic_learning_rate.
DIFFERENT_BY_DESIGN = {
    ("reference_devices", MADPOConfig), ("reference_devices", MADPOIterConfig),
    ("num_generations", MAGRPOConfig), ("num_generations", MAREINFORCEConfig), ("num_generations", MARLOOConfig),
    ("num_generations", MAReMaxConfig), ("critic_learning_rate", MAACConfig),
}

# Shared options with no rule (anything goes, or checked where they are used).
UNCHECKED = {"advantage_normalization", "external_prompt_passthrough", "reference_kl_enabled", "seed",
             "use_separate_critic"}


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _message(cls, kwargs) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = {k: v for k, v in kwargs.items() if k in _fields(cls)}  # extras another config needs
        with pytest.raises(ValueError) as err:
            cls(**kwargs)
    return str(err.value)


@pytest.mark.parametrize(("option", "value", "extra"), SHARED_BAD,
                         ids=[f"{o}={v!r}" for o, v, _ in SHARED_BAD])
def test_a_shared_option_has_one_message_in_every_config(option, value, extra):
    classes = [c for c in CONFIGS if option in _fields(c) and (option, c) not in DIFFERENT_BY_DESIGN]
    assert len(classes) >= 2, option
    messages = {c.__name__: _message(c, {option: value, **extra}) for c in classes}
    assert len(set(messages.values())) == 1, messages
    message = next(iter(messages.values()))
    assert message.startswith(option) and f"Got {value!r}." in message and "Allowed:" in message, message


def test_every_option_shared_across_families_has_a_rule_here():
    families = [_fields(MARLHFConfig), _fields(MAGRPOConfig), _fields(IACConfig) | _fields(MAACConfig)]
    shared = {name for name in set().union(*families) if sum(name in f for f in families) >= 2}
    covered = {option for option, _, _ in SHARED_BAD} | UNCHECKED
    assert shared - covered == set()


# --- the drift that the groups removed -----------------------------------------------------------------------

def test_value_loss_coef_must_be_positive_for_iac_maac_and_marlhf():
    for cls in (IACConfig, MAACConfig, MARLHFConfig):
        with pytest.raises(ValueError, match=r"^value_loss_coef must be > 0\. Got 0\."):
            cls(value_loss_coef=0)
    assert MARLHFConfig(rl_algorithm="iac", num_generations=1, value_loss_coef=0.5).actor_critic_config() \
        .value_loss_coef == 0.5


def test_critic_type_message_is_the_same_for_actor_critic_and_marlhf():
    messages = {_message(cls, {"critic_type": "w"}) for cls in (IACConfig, MAACConfig, MARLHFConfig)}
    assert messages == {"critic_type must be one of: v, q. Got 'w'. Allowed: v, q (case-insensitive)."}


def test_iac_and_marlhf_critic_learning_rate_agree():
    assert IACConfig(critic_learning_rate=None, agent_learning_rate=1e-4).critic_learning_rate == 1e-4
    assert MARLHFConfig(critic_learning_rate=None).critic_learning_rate is None
    for value in (0, -1e-5, float("nan")):
        assert _message(IACConfig, {"critic_learning_rate": value}) == _message(
            MARLHFConfig, {"critic_learning_rate": value})
        assert _message(IACConfig, {"critic_learning_rate": value}).startswith(
            "critic_learning_rate must be > 0 or null.")
    with pytest.raises(ValueError, match="MAAC does not fall back to agent_learning_rate"):
        MAACConfig(critic_learning_rate=None)


def test_bools_are_not_counts_anywhere():
    with pytest.raises(ValueError, match="num_generations must be >= 1"):
        IACConfig(num_generations=True)
    with pytest.raises(ValueError, match="value_head_hidden_dim must be >= 1 or null"):
        IACConfig(value_head_hidden_dim=True)
    for cls in (MADPOConfig, MAGRPOConfig, IACConfig, MARLHFConfig):
        with pytest.raises(ValueError, match="num_agents must be >= 1"):
            cls(num_agents=True)


def test_reference_devices_message_is_the_same_for_rl_actor_critic_and_marlhf():
    kw = {"reference_kl_enabled": True, "reference_devices": ["cpu", "cpu", "cpu"]}
    messages = {_message(cls, kw) for cls in (MAGRPOConfig, IACConfig, MAACConfig, MARLHFConfig)}
    assert len(messages) == 1 and next(iter(messages)).startswith("reference_devices length (3) must be 1 or N.")


def test_preference_configs_check_the_rl_stage_options_they_forward():
    for kw in ({"discount": 2.0}, {"early_termination_threshold": "soon"}, {"advantage_mode": "median"},
               {"agent_learning_rate": 0.0}, {"train_batch_size": 2.5}, {"reference_kl_coef": math.nan}):
        for cls in (MADPOConfig, MARLHFConfig):
            with pytest.raises(ValueError, match=f"^{next(iter(kw))}"):
                cls(**kw)
    assert MADPOConfig(early_termination_threshold="0.5").early_termination_threshold == 0.5
    assert MADPOConfig(advantage_mode=" RLOO ").advantage_mode == "rloo"


def test_device_lists_follow_one_rule():
    for cls in (MADPOConfig, MAGRPOConfig, IACConfig):
        assert _message(cls, {"parallel_training": "mp", "agent_devices": ["cpu"] * 3, "critic_devices": "cpu"}) \
            .startswith("agent_devices length (3) must be 1 or 2.")
        assert cls(agent_devices=["cpu"] * 3).agent_devices == ["cpu"] * 3  # "none": the first entry is used
    with pytest.raises(ValueError, match=r"^critic_devices length \(2\) must be 1 or 1\."):
        MARLHFConfig(rl_algorithm="maac", num_generations=1, parallel_training="mp", agent_devices="cpu",
                     critic_devices=["cpu", "cpu"])
    assert MARLHFConfig(critic_devices=["cpu"] * 3).critic_devices == ["cpu"] * 3  # magrpo: no critic


def test_public_configs_keep_their_own_defaults():
    assert (MADPOConfig().top_k, MAGRPOConfig().top_k, IACConfig().top_k) == (50, 50, None)
    assert (MADPOConfig().rollout_buffer_size, IACConfig().rollout_buffer_size) == (2, 8)
    assert (MAGRPOConfig().logging_steps, MAACConfig().logging_steps) == (50, 1)
    assert (MAGRPOConfig().num_generations, IACConfig().num_generations, MARLHFConfig().num_generations) == (4, 1, 4)
    assert (IACConfig().critic_learning_rate, MARLHFConfig().critic_learning_rate) == (5e-6, None)
    assert (MADPOIterConfig().num_train_epochs, MARLHFIterConfig().num_train_epochs) == (1, 2)
    assert not hasattr(MAACConfig(), "value_clip_range") and not hasattr(MADPOConfig(), "num_generations")
