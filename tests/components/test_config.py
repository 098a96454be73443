"""Config defaults (docs/preference.md §2.1, §2.3, §2.4), aliases (docs/preference.md §2.5), validation messages and
order (docs/preference.md §2.6), secrets."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from comlrl_lightning.config import MADPOConfig, MADPOIterConfig

# --- defaults -----------------------------------------------------------------------------------------------

BASE_DEFAULTS = {
    "num_train_epochs": 20, "agent_learning_rate": 5e-6, "logging_steps": 50, "num_agents": 2,
    "collaboration_mode": "decentralized", "parallel_training": "none", "agent_devices": None,
    "max_new_tokens": 256, "temperature": 0.6, "top_p": 0.6, "top_k": 50, "num_turns": 1, "discount": 1.0,
    "joint_mode": "aligned", "early_termination_threshold": None, "external_prompt_passthrough": False,
    "eval_interval": 16, "eval_num_samples": 4, "eval_batch_size": 1, "rollout_buffer_size": 2,
    "train_batch_size": 2,  # None -> rollout_buffer_size
    "advantage_normalization": True, "advantage_mode": "mean", "reference_kl_enabled": False,
    "reference_kl_coef": 0.1, "reference_devices": None, "preference_num_candidates": 80,
    "preference_pairs_per_sample": 16, "pair_selection": "reward_gap", "dpo_beta": 0.1,
    "use_environment_step": True, "environment_steps_per_pair": 2,
}

ITER_DEFAULTS = {
    "num_iterations": 6, "preference_replay_mode": "current", "preference_replay_k": None,
    "preference_replay_lambda": None, "preference_replay_sample_size": None, "preference_replay_dir": None,
    "log_reward_distribution": False, "policy_checkpoint_dir": None, "comparator_policy": "current",
    "comparator_generation_mode": "decentralized", "comparator_centralized_agent_index": 0,
    "comparator_model_name": None, "comparator_agents": None, "comparator_devices": None,
    "comparator_num_candidates": None, "comparator_history_k": None, "comparator_api_url": None,
    "comparator_api_format": "generic", "comparator_api_model": None,
    "comparator_api_max_n_per_request": None,
    "comparator_api_timeout": 120.0, "comparator_api_headers": None, "comparator_api_key": None,
    "comparator_api_key_env": None, "comparator_api_key_header": "Authorization",
    "comparator_api_key_prefix": "Bearer", "comparator_api_response_field": "completions",
    "comparator_api_extra_body": None,
}

# docs/preference.md §2.4: the iterative trainer's own defaults.
ITER_OVERRIDES = {"num_train_epochs": 1, "preference_num_candidates": 20, "preference_pairs_per_sample": 4,
                  "pair_selection": "comparator_reward"}


def test_madpo_defaults():
    cfg = MADPOConfig()
    for name, value in BASE_DEFAULTS.items():
        assert getattr(cfg, name) == value, name
    assert not hasattr(cfg, "num_generations")
    assert not hasattr(cfg, "comparator_policy")
    assert MADPOConfig(rollout_buffer_size=5).train_batch_size == 5
    assert MADPOConfig(rollout_buffer_size=5, train_batch_size=3).train_batch_size == 3


def test_madpo_iter_defaults():
    cfg = MADPOIterConfig()
    expected = {**BASE_DEFAULTS, **ITER_OVERRIDES, **ITER_DEFAULTS}
    for name, value in expected.items():
        assert getattr(cfg, name) == value, name
    assert {f.name for f in dataclasses.fields(cfg)} >= set(expected)


def test_to_dict_is_plain():
    d = MADPOConfig(dpo_beta=0.2).to_dict()
    assert d["dpo_beta"] == 0.2 and set(d) >= set(BASE_DEFAULTS)


# --- base validation ----------------------------------------------------------------------------------------

# (kwargs, option named in the message, value given, upstream's opening sentence)
BASE_ERRORS = [
    ({"num_train_epochs": 0}, "num_train_epochs", 0, "num_train_epochs must be >= 1."),
    ({"num_agents": 0}, "num_agents", 0, "num_agents must be >= 1."),
    ({"rollout_buffer_size": 0}, "rollout_buffer_size", 0, "rollout_buffer_size must be >= 1."),
    ({"eval_interval": -1}, "eval_interval", -1, "eval_interval must be >= 0."),
    ({"eval_num_samples": -2}, "eval_num_samples", -2, "eval_num_samples must be >= 0."),
    ({"eval_batch_size": 0}, "eval_batch_size", 0, "eval_batch_size must be >= 1."),
    ({"num_turns": 0}, "num_turns", 0, "num_turns must be >= 1."),
    ({"num_turns": 2}, "num_turns", 2, "MADPO currently supports num_turns=1 only."),
    ({"logging_steps": 0}, "logging_steps", 0, "logging_steps must be >= 1."),
    ({"train_batch_size": 0}, "train_batch_size", 0, "train_batch_size must be >= 1."),
    ({"parallel_training": "ddp"}, "parallel_training", "ddp", "parallel_training only supports: none, mp."),
    ({"parallel_training": "mp"}, "parallel_training", None,
     "parallel_training='mp' requires explicit agent_devices."),
    ({"reference_kl_coef": -0.5}, "reference_kl_coef", -0.5, "reference_kl_coef must be >= 0."),
    ({"preference_num_candidates": 1}, "preference_num_candidates", 1,
     "preference_num_candidates must be >= 2."),
    ({"preference_pairs_per_sample": 0}, "preference_pairs_per_sample", 0,
     "preference_pairs_per_sample must be >= 1 or null."),
    ({"dpo_beta": 0}, "dpo_beta", 0, "dpo_beta must be > 0."),
    ({"dpo_beta": -0.1}, "dpo_beta", -0.1, "dpo_beta must be > 0."),
    ({"environment_steps_per_pair": 0}, "environment_steps_per_pair", 0,
     "environment_steps_per_pair must be >= 1."),
    ({"pair_selection": "best"}, "pair_selection", "best",
     "pair_selection must be one of: reward_gap, all, random."),
    ({"pair_selection": "comparator_reward"}, "pair_selection", "comparator_reward",
     "pair_selection must be one of: reward_gap, all, random."),
    ({"pair_selection": "all"}, "pair_selection", 16,
     "preference_pairs_per_sample must be null when pair_selection='all'."),
    ({"joint_mode": "cross"}, "joint_mode", "cross",
     "MADPO preference generation currently supports aligned joint_mode only."),
    ({"joint_mode": "crossed"}, "joint_mode", "crossed",
     "MADPO preference generation currently supports aligned joint_mode only."),
    ({"joint_mode": "diagonal"}, "joint_mode", "diagonal", "joint_mode must be one of: aligned, cross."),
    ({"collaboration_mode": "solo"}, "collaboration_mode", "solo",
     "collaboration_mode must be decentralized or centralized."),
    ({"collaboration_mode": "Decentralized"}, "collaboration_mode", "Decentralized",
     "collaboration_mode must be decentralized or centralized."),
    ({"max_new_tokens": 0}, "max_new_tokens", 0, None),
    ({"temperature": 0.0}, "temperature", 0.0, None),
    ({"top_p": 0.0}, "top_p", 0.0, None),
    ({"top_p": 1.5}, "top_p", 1.5, None),
    ({"top_k": 0}, "top_k", 0, None),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps", 0, None),
    ({"gradient_clip_val": 0.0}, "gradient_clip_val", 0.0, None),
]


@pytest.mark.parametrize(("kwargs", "option", "value", "opening"), BASE_ERRORS,
                         ids=[f"{next(iter(k))}={next(iter(k.values()))!r}" for k, *_ in BASE_ERRORS])
@pytest.mark.parametrize("cls", [MADPOConfig, MADPOIterConfig])
def test_base_validation_errors(cls, kwargs, option, value, opening):
    if cls is MADPOIterConfig and kwargs.get("pair_selection") == "comparator_reward":
        pytest.skip("comparator_reward is valid for the iterative config")
    if cls is MADPOIterConfig and kwargs == {"pair_selection": "all"}:
        value = 4  # the iterative default limit
    with pytest.raises(ValueError) as err:
        cls(**kwargs)
    msg = str(err.value)
    assert option in msg
    assert f"Got {value!r}" in msg
    if opening is not None:
        if cls is MADPOIterConfig:
            opening = opening.replace("MADPO preference", "MADPOIter preference")
            opening = opening.replace("reward_gap, all, random.",
                                      "reward_gap, all, random, comparator_reward.")
        assert msg.startswith(opening), msg


def test_iterative_pair_selection_accepts_comparator_reward_only_there():
    assert MADPOIterConfig(pair_selection="comparator_reward").pair_selection == "comparator_reward"
    with pytest.raises(ValueError, match="reward_gap, all, random, comparator_reward"):
        MADPOIterConfig(pair_selection="nope")


def test_base_normalisation():
    assert MADPOConfig(pair_selection=" Random ").pair_selection == "random"
    assert MADPOConfig(pair_selection=None).pair_selection == "reward_gap"
    assert MADPOConfig(pair_selection="").pair_selection == "reward_gap"
    assert MADPOConfig(pair_selection="ALL", preference_pairs_per_sample=None).pair_selection == "all"
    assert MADPOConfig(parallel_training="NULL").parallel_training == "none"
    assert MADPOConfig(parallel_training=None).parallel_training == "none"
    assert MADPOConfig(parallel_training="MP", agent_devices=["cpu"]).parallel_training == "mp"
    for jm in ("aligned", "align", " ALIGN ", None):
        assert MADPOConfig(joint_mode=jm).joint_mode == "aligned"
    assert MADPOConfig(top_k=None).top_k is None
    assert MADPOConfig(preference_pairs_per_sample=None).preference_pairs_per_sample is None


def test_reference_kl_warns_and_is_accepted():
    with pytest.warns(UserWarning, match="reference-free"):
        cfg = MADPOConfig(reference_kl_enabled=True)
    assert cfg.reference_kl_enabled is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MADPOConfig()


# --- aliases (docs/preference.md §2.5) --------------------------------------------------------------------------------

REPLAY_ALIASES = {
    "current": "current", "latest": "current", "new": "current",
    "nearest_k": "nearest_k", "recent_k": "nearest_k", "last_k": "nearest_k", "k": "nearest_k",
    "all_history": "all_history",
    "lambda": "lambda_decay", "lambda_decay": "lambda_decay", "td_lambda": "lambda_decay",
    "td-lambda": "lambda_decay",
}
EXTRA_FOR_MODE = {"current": {}, "nearest_k": {"preference_replay_k": 2}, "all_history": {},
                  "lambda_decay": {"preference_replay_lambda": 0.5}}


@pytest.mark.parametrize(("alias", "canonical"), sorted(REPLAY_ALIASES.items()))
def test_replay_mode_aliases(alias, canonical):
    cfg = MADPOIterConfig(preference_replay_mode=f"  {alias.upper()} ", **EXTRA_FOR_MODE[canonical])
    assert cfg.preference_replay_mode == canonical


POLICY_ALIASES = {
    "current": "current", "self": "current", "online": "current",
    "current_copy": "current_copy", "copy": "current_copy", "online_copy": "current_copy",
    "current-offload": "current_copy", "current_offload": "current_copy",
    "model": "model", "external": "model", "comparator": "model", "reference": "model", "ref": "model",
    "history": "history", "checkpoint": "history", "previous": "history", "previous_iteration": "history",
    "api": "api", "http": "api", "endpoint": "api",
}
EXTRA_FOR_POLICY = {"model": {"comparator_model_name": "embedded:tiny"},
                    "api": {"comparator_api_url": "http://localhost:1/v1"}}


@pytest.mark.parametrize(("alias", "canonical"), sorted(POLICY_ALIASES.items()))
def test_comparator_policy_aliases(alias, canonical):
    cfg = MADPOIterConfig(comparator_policy=f" {alias.title()} ", **EXTRA_FOR_POLICY.get(canonical, {}))
    assert cfg.comparator_policy == canonical
    if canonical == "history":
        assert cfg.comparator_history_k == 1


@pytest.mark.parametrize(("alias", "canonical"), [
    ("decentralized", "decentralized"), ("decentralised", "decentralized"), ("multi_agent", "decentralized"),
    ("multi-agent", "decentralized"), ("centralized", "centralized"), ("centralised", "centralized"),
    ("single_agent", "centralized"), ("single-agent", "centralized"), (None, "decentralized"),
])
def test_generation_mode_aliases(alias, canonical):
    assert MADPOIterConfig(comparator_generation_mode=alias).comparator_generation_mode == canonical


@pytest.mark.parametrize(("alias", "canonical"), [
    ("generic", "generic"), ("openai", "openai"), ("openai_chat", "openai"), ("chat", "openai"),
    ("anthropic", "anthropic"), ("anthropic_messages", "anthropic"), ("messages", "anthropic"),
    ("openai_responses", "openai_responses"), ("responses", "openai_responses"),
    ("codex", "openai_responses"),
    (" OpenAI ", "openai"),
])
def test_api_format_aliases(alias, canonical):
    assert MADPOIterConfig(comparator_api_format=alias).comparator_api_format == canonical


def test_none_means_default():
    cfg = MADPOIterConfig(preference_replay_mode=None, comparator_policy=None)
    assert cfg.preference_replay_mode == "current" and cfg.comparator_policy == "current"


# --- iterative validation (docs/preference.md §2.3) -------------------------------------------------------------------

URL = {"comparator_api_url": "http://localhost:1/v1"}
ITER_ERRORS = [
    ({"num_iterations": 0}, "num_iterations", 0),
    ({"preference_replay_mode": "all"}, "preference_replay_mode", "all"),
    ({"preference_replay_mode": "sometimes"}, "preference_replay_mode", "sometimes"),
    ({"preference_replay_sample_size": 5}, "preference_replay_sample_size", 5),
    ({"preference_replay_k": 2}, "preference_replay_k", 2),
    ({"preference_replay_mode": "nearest_k"}, "preference_replay_k", None),
    ({"preference_replay_mode": "nearest_k", "preference_replay_k": 0}, "preference_replay_k", 0),
    ({"preference_replay_mode": "all_history", "preference_replay_k": 2}, "preference_replay_k", 2),
    ({"preference_replay_mode": "lambda_decay", "preference_replay_lambda": 0.5, "preference_replay_k": 1},
     "preference_replay_k", 1),
    ({"preference_replay_mode": "lambda_decay"}, "preference_replay_lambda", None),
    ({"preference_replay_mode": "lambda_decay", "preference_replay_lambda": 1.5},
     "preference_replay_lambda", 1.5),
    ({"preference_replay_mode": "lambda_decay", "preference_replay_lambda": -0.1},
     "preference_replay_lambda", -0.1),
    ({"preference_replay_lambda": 0.5}, "preference_replay_lambda", 0.5),
    ({"preference_replay_mode": "all_history", "preference_replay_lambda": 0.5},
     "preference_replay_lambda", 0.5),
    ({"preference_replay_mode": "all_history", "preference_replay_sample_size": 0},
     "preference_replay_sample_size", 0),
    ({"comparator_policy": "oracle"}, "comparator_policy", "oracle"),
    ({"comparator_generation_mode": "hybrid"}, "comparator_generation_mode", "hybrid"),
    ({"comparator_generation_mode": "centralized", "comparator_centralized_agent_index": 2},
     "comparator_centralized_agent_index", 2),
    ({"comparator_generation_mode": "centralized", "comparator_centralized_agent_index": -1},
     "comparator_centralized_agent_index", -1),
    ({"comparator_num_candidates": 0}, "comparator_num_candidates", 0),
    ({"comparator_api_max_n_per_request": 0}, "comparator_api_max_n_per_request", 0),
    ({"comparator_policy": "model"}, "comparator_model_name", None),
    ({"comparator_model_name": "some/model"}, "comparator_model_name", "some/model"),
    ({"comparator_policy": "current_copy", "comparator_agents": ["a", "b"]}, "comparator_agents", ["a", "b"]),
    ({"comparator_policy": "history", "comparator_model_name": "x"}, "comparator_model_name", "x"),
    ({"comparator_policy": "model", "comparator_agents": ["a", "b", "c"]}, "comparator_agents", 3),
    ({"comparator_policy": "model", "comparator_generation_mode": "centralized",
      "comparator_agents": ["a", "b", "c"]}, "comparator_agents", 3),
    ({"comparator_history_k": 2}, "comparator_history_k", 2),
    ({"comparator_policy": "api", "comparator_history_k": 1, **URL}, "comparator_history_k", 1),
    ({"comparator_policy": "history", "comparator_history_k": 0}, "comparator_history_k", 0),
    ({"comparator_api_format": "grpc"}, "comparator_api_format", "grpc"),
    ({"comparator_policy": "api"}, "comparator_api_url", None),
    ({"comparator_policy": "api", "comparator_api_url": ""}, "comparator_api_url", ""),
    ({"comparator_api_timeout": 0}, "comparator_api_timeout", 0),
]


@pytest.mark.parametrize(("kwargs", "option", "value"), ITER_ERRORS,
                         ids=[",".join(f"{k}={v!r}" for k, v in kw.items()) for kw, *_ in ITER_ERRORS])
def test_iterative_validation_errors(kwargs, option, value):
    with pytest.raises(ValueError) as err:
        MADPOIterConfig(**kwargs)
    msg = str(err.value)
    assert option in msg
    assert f"Got {value!r}" in msg


def test_valid_iterative_combinations():
    assert MADPOIterConfig(preference_replay_k=1).preference_replay_k == 1  # current allows k=1
    cfg = MADPOIterConfig(preference_replay_mode="nearest_k", preference_replay_k=3,
                          preference_replay_sample_size=10)
    assert (cfg.preference_replay_k, cfg.preference_replay_sample_size) == (3, 10)
    for lam in (0.0, 1.0):
        assert MADPOIterConfig(preference_replay_mode="lambda_decay",
                               preference_replay_lambda=lam).preference_replay_lambda == lam
    assert MADPOIterConfig(comparator_policy="history", comparator_history_k=3).comparator_history_k == 3
    per_role = MADPOIterConfig(comparator_policy="model", comparator_agents=["a", "b"])
    assert per_role.comparator_agents == ["a", "b"]
    cen = MADPOIterConfig(comparator_policy="model", comparator_generation_mode="centralized",
                          comparator_agents=["a"], comparator_centralized_agent_index=1)
    assert cen.comparator_generation_mode == "centralized"
    # docs/preference.md §2.3: a comparator model name is not rejected for the api policy.
    api = MADPOIterConfig(comparator_policy="api", comparator_model_name="x", **URL)
    assert api.comparator_policy == "api"
    # The centralized index is checked only in centralized generation.
    assert MADPOIterConfig(comparator_centralized_agent_index=5).comparator_centralized_agent_index == 5


# --- first-error order (docs/preference.md §2.6) ----------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "first"), [
    ({"num_agents": 0, "num_train_epochs": 0}, "num_train_epochs must be >= 1."),
    ({"eval_batch_size": 0, "rollout_buffer_size": 0}, "rollout_buffer_size must be >= 1."),
    ({"preference_num_candidates": 1, "num_turns": 2}, "MADPO currently supports num_turns=1 only."),
    ({"dpo_beta": 0, "preference_pairs_per_sample": 0}, "preference_pairs_per_sample must be >= 1 or null."),
    ({"pair_selection": "bogus", "environment_steps_per_pair": 0},
     "environment_steps_per_pair must be >= 1."),
    ({"num_iterations": 0, "dpo_beta": 0}, "dpo_beta must be > 0."),
    ({"preference_replay_mode": "bogus", "num_iterations": 0}, "num_iterations must be >= 1."),
    ({"comparator_policy": "bogus", "preference_replay_mode": "nearest_k"},
     "preference_replay_k is required when preference_replay_mode='nearest_k'."),
    ({"comparator_api_max_n_per_request": 0, "comparator_num_candidates": 0},
     "comparator_num_candidates must be >= 1 or null."),
    ({"comparator_policy": "api", "comparator_num_candidates": 0}, "comparator_num_candidates must be >= 1"),
    ({"comparator_policy": "model", "comparator_generation_mode": "bogus"},
     "comparator_generation_mode must be one of"),
])
def test_first_error_follows_spec_order(kwargs, first):
    with pytest.raises(ValueError) as err:
        MADPOIterConfig(**kwargs)
    assert str(err.value).startswith(first), str(err.value)


# --- secrets ------------------------------------------------------------------------------------------------

def test_api_key_never_shown():
    secret = "sk-test-SECRET-0123456789"
    cfg = MADPOIterConfig(comparator_policy="api", comparator_api_url="http://localhost:1/v1",
                          comparator_api_key=secret)
    assert cfg.comparator_api_key == secret  # still usable by the comparator
    assert secret not in repr(cfg)
    assert secret not in str(cfg)
    assert secret not in str(cfg.to_dict())
    assert cfg.to_dict()["comparator_api_key"] != secret
    assert "comparator_api_url='http://localhost:1/v1'" in repr(cfg)
    assert repr(cfg).startswith("MADPOIterConfig(")
    # No key: nothing to hide, the field reads None.
    assert MADPOIterConfig().to_dict()["comparator_api_key"] is None


def test_secret_headers_are_redacted_in_dumps():
    from comlrl_lightning.config import MADPOIterConfig

    cfg = MADPOIterConfig(comparator_policy="api", comparator_api_url="http://127.0.0.1:1/x",
                          comparator_api_headers={"Authorization": "Bearer sk-secret", "X-Trace": "abc",
                                                  "Content-Type": "application/json"})
    dumped = cfg.to_dict()["comparator_api_headers"]
    # every header value is a secret unless the header is known-safe
    assert dumped == {"Authorization": "***", "X-Trace": "***", "Content-Type": "application/json"}
    assert "sk-secret" not in repr(cfg)


@pytest.mark.parametrize("option, value", [
    ("agent_learning_rate", 0), ("agent_learning_rate", float("nan")), ("temperature", float("inf")),
    ("preference_num_candidates", "4"), ("preference_num_candidates", 2.5), ("seed", "abc"), ("seed", 1.5),
    ("max_new_tokens", "8"), ("num_train_epochs", 2.0),
])
def test_bad_numeric_options_are_clear_errors_in_every_family(option, value):
    """Issue 14, finding 10: wrong types and non-finite values are a ValueError naming the option, never a
    TypeError from deep inside the run."""
    from comlrl_lightning.config import (
        IACConfig,
        MAACConfig,
        MADPOConfig,
        MADPOIterConfig,
        MAGRPOConfig,
        MARLHFConfig,
        MARLHFIterConfig,
    )

    checked = 0
    for cls in (MADPOConfig, MADPOIterConfig, MAGRPOConfig, IACConfig, MAACConfig, MARLHFConfig, MARLHFIterConfig):
        if option not in cls.__dataclass_fields__:
            continue
        extra = {"num_generations": 1} if cls in (IACConfig, MAACConfig) else {}
        with pytest.raises(ValueError, match=option):
            cls(**{option: value}, **extra)
        checked += 1
    assert checked >= 2
