"""docs/coming-from-comlrl.md stays honest: its option table lists exactly CoMLRL's options (every config field
but ours), every refused row is refused with the documented message, and every other row is read by the
library: attribute reads on the config objects are recorded (only reads made by library code outside the
config package count; validation does not) while tiny runs of every trainer family go through construction and
a fit. Options that only matter in a mode the tiny runs do not enter are listed in MODE_SPECIFIC with the
reason, and must at least be read by name in the library's source.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
from pathlib import Path

import pytest
from conftest import cpu_trainer_kwargs

import comlrl_lightning.config as cfg_pkg

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "coming-from-comlrl.md"
PKG = ROOT / "comlrl_lightning"
LIB_DIRS = (str(PKG) + "/", str(ROOT / "callbacks") + "/")
CONFIG_DIR = str(PKG / "config") + "/"
OURS = {"seed", "gradient_clip_val", "gradient_accumulation_steps", "generation_backend", "vllm_kwargs",
        "reward_length_features", "reward_clip_quantile", "agent_overlap", "generation_batch_size",
        "logprob_gap_threshold", "use_chat_template"}
CONFIGS = {"MADPO": cfg_pkg.MADPOConfig, "MADPOIter": cfg_pkg.MADPOIterConfig, "MARLHF": cfg_pkg.MARLHFConfig,
           "MARLHFIter": cfg_pkg.MARLHFIterConfig, "MAGRPO": cfg_pkg.MAGRPOConfig, "IAC": cfg_pkg.IACConfig,
           "MAAC": cfg_pkg.MAACConfig}
ROW_RE = re.compile(r"^\| `(\w+)` \| ([\w, ]+) \| (same|renamed|deviation|pending|refused) \| (.*) \|$", re.M)

# option -> why the tiny runs below do not read it (it is checked by name in the source instead)
MODE_SPECIFIC = {
    "comparator_agents": "comparator_policy='model' with per-role sources",
    "comparator_model_name": "comparator_policy='model'",
    "comparator_centralized_agent_index": "comparator_generation_mode='centralized'",
    "reference_devices": "reference_kl_enabled=True",
    "agent_devices": "parallel_training='mp'",
    "critic_devices": "parallel_training='mp' with critics",
    "reward_max_length": "forwarded by MARLHFConfig.reward_model_options() (config package) to the reward model",
    "reward_freeze_backbone": "forwarded by MARLHFConfig.reward_model_options() (config package) to the reward model",
    "reward_learning_rate": "forwarded by MARLHFConfig.reward_model_options() (config package) to the reward model",
    "reward_num_train_epochs": "forwarded by MARLHFConfig.reward_model_options() (config package) to the reward model",
    "reward_train_batch_size": "forwarded by MARLHFConfig.reward_model_options() (config package) to the reward model",
    "value_clip_range": "IAC with value heads on the actors",
}


def doc_rows() -> dict[str, tuple[list[str], str, str]]:
    rows = {}
    for name, configs, status, notes in ROW_RE.findall(DOC.read_text(encoding="utf-8")):
        assert name not in rows, f"{name} listed twice"
        rows[name] = ([c.strip() for c in configs.split(",")], status, notes)
    return rows


def comlrl_options() -> dict[str, list[str]]:
    where: dict[str, list[str]] = {}
    for label, cls in CONFIGS.items():
        for f in dataclasses.fields(cls):
            if f.name not in OURS:
                where.setdefault(f.name, []).append(label)
    return where


def test_the_table_lists_exactly_comlrls_options_and_their_configs():
    rows, options = doc_rows(), comlrl_options()
    assert sorted(rows) == sorted(options)
    for name, (configs, _, _) in rows.items():
        assert configs == options[name], name


REFUSAL_RE = re.compile(r'`([^`]+)` in ([\w, ]+?) raises "([^"]+)"')


def test_refusals_in_the_table_are_refused_with_the_documented_message():
    # No option value is refused today (collaboration_mode="centralized" was the last); new refusals are checked.
    for name, (_, status, notes) in doc_rows().items():
        assert status != "refused" or REFUSAL_RE.search(notes), f"{name}: a refused row must quote its message"
        for value, configs, message in REFUSAL_RE.findall(notes):
            for label in (c.strip() for c in configs.split(",")):
                with pytest.raises(ValueError, match=re.escape(message)):
                    CONFIGS[label](**{name: ast.literal_eval(value)})


def test_no_row_is_pending():
    # Every option takes effect (or is refused with its message): none is merely accepted.
    assert not [name for name, (_, status, _) in doc_rows().items() if status == "pending"]


# --- "something reads it" -----------------------------------------------------------------------------------
READS: set[str] = set()


def recording(cls: type) -> type:
    """A subclass of config ``cls`` that records the option names library code reads (outside config/)."""

    def __getattribute__(self, name):
        if not name.startswith("_"):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(LIB_DIRS) and not caller.startswith(CONFIG_DIR):
                READS.add(name)
        return object.__getattribute__(self, name)

    return type(cls.__name__, (cls,), {"__getattribute__": __getattribute__, "__module__": cls.__module__})


TINY = {"max_new_tokens": 2, "temperature": 1.0, "top_p": 1.0, "top_k": 5, "eval_num_samples": 1, "eval_interval": 1,
        "logging_steps": 2, "eval_batch_size": 2, "num_train_epochs": 1, "agent_learning_rate": 1e-3}
ITEMS = [{"prompt": "Say hi."}, {"prompt": "Count."}]


def _reward(c1, c2):
    return [float(len(a) > len(b)) for a, b in zip(c1, c2)]


def _runs(model_dir, root):
    from comlrl_lightning.multiturn.transitions import plain_transition
    from comlrl_lightning.rewards import set_reward_range
    from comlrl_lightning.trainers.actor_critic import IACTrainer, MAACTrainer
    from comlrl_lightning.trainers.madpo import MADPOIterTrainer
    from comlrl_lightning.trainers.marlhf import MARLHFIterTrainer
    from comlrl_lightning.trainers.preference import MADPOTrainer
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    common = {"agent_model": model_dir, "train_dataset": ITEMS, "eval_dataset": ITEMS}
    pref = {"preference_num_candidates": 2, "preference_pairs_per_sample": 1, "dpo_beta": 0.2,
            "environment_steps_per_pair": 3, "use_environment_step": True, "pair_selection": "random",
            "rollout_buffer_size": 3, "train_batch_size": 1}
    MADPOTrainer(**common, reward_func=_reward, args=recording(cfg_pkg.MADPOConfig)(**TINY, **pref),
                 trainer_kwargs=cpu_trainer_kwargs()).train()
    ranged = set_reward_range(_reward, 0.0, 1.0)
    it = {**pref, "pair_selection": "comparator_reward", "num_iterations": 2, "preference_replay_mode": "lambda_decay",
          "preference_replay_lambda": 0.5, "preference_replay_sample_size": 2, "log_reward_distribution": True,
          "comparator_policy": "history", "comparator_history_k": 1,
          "preference_replay_dir": str(root / "replay")}
    MADPOIterTrainer(**common, reward_func=ranged, args=recording(cfg_pkg.MADPOIterConfig)(**TINY, **it),
                     trainer_kwargs=cpu_trainer_kwargs(default_root_dir=str(root))).train()
    mt = {"num_generations": 2, "num_turns": 2, "joint_mode": "cross", "advantage_mode": "rloo",
          "advantage_normalization": False, "early_termination_threshold": 5.0, "external_prompt_passthrough": True,
          "rollout_buffer_size": 1, "discount": 0.9}
    MAGRPOTrainer(**common, reward_func=_reward, external_transition=plain_transition,
                  args=recording(cfg_pkg.MAGRPOConfig)(**TINY, **mt), trainer_kwargs=cpu_trainer_kwargs()).train()
    ac = {"num_turns": 1, "num_generations": 1, "rollout_buffer_size": 1, "critic_type": "q", "value_loss_coef": 0.5,
          "critic_learning_rate": 1e-3, "discount": 0.9}
    IACTrainer(**common, reward_func=_reward, args=recording(cfg_pkg.IACConfig)(**TINY, **ac),
               trainer_kwargs=cpu_trainer_kwargs()).train()
    MAACTrainer(**common, reward_func=_reward, args=recording(cfg_pkg.MAACConfig)(**TINY, **ac),
                trainer_kwargs=cpu_trainer_kwargs()).train()
    rl = {**it, "rl_algorithm": "iac", "num_generations": 1, "preference_scoring_reward": "reward_model",
          "reward_model_name": model_dir, "reward_model_device": "cpu", "reward_max_length": 256,
          "reward_freeze_backbone": True, "reward_learning_rate": 1e-4, "reward_num_train_epochs": 1,
          "reward_train_batch_size": 2, "critic_model_name": model_dir, "critic_type": "q",
          "preference_replay_dir": str(root / "replay_rlhf"), "policy_checkpoint_dir": str(root / "snap_rlhf")}
    MARLHFIterTrainer(**common, reward_func=ranged, args=recording(cfg_pkg.MARLHFIterConfig)(**TINY, **rl),
                      trainer_kwargs=cpu_trainer_kwargs(default_root_dir=str(root / "rlhf"))).train()


def _source_names() -> set[str]:
    names: set[str] = set()
    files = [p for p in PKG.rglob("*.py") if not str(p).startswith(CONFIG_DIR)] + sorted((ROOT / "callbacks").glob("*.py"))
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
    return names


@pytest.mark.slow
def test_every_documented_option_is_read_by_the_library(tiny_model_dir, tmp_path):
    from comlrl_lightning.comparators.api_client import APIComparatorClient

    READS.clear()
    _runs(tiny_model_dir, tmp_path)
    api = recording(cfg_pkg.MADPOIterConfig)(comparator_policy="api", comparator_api_url="http://localhost:1/x")
    APIComparatorClient.from_config(api)
    in_source = _source_names()
    missing = []
    for name, (_, status, _) in doc_rows().items():
        if status == "refused":
            continue
        if name in READS:
            continue
        if name in MODE_SPECIFIC and name in in_source:
            continue
        missing.append(name)
    assert not missing, f"documented options no library code read: {missing}"
    stale = sorted(n for n in MODE_SPECIFIC if n in READS)
    assert not stale, f"read by the tiny runs, drop them from MODE_SPECIFIC: {stale}"
