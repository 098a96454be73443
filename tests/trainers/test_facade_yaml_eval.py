"""The facade and the YAML path evaluate alike: the same MAGRPO job run through ``MAGRPOTrainer`` and through
``comlrl-lightning fit --config configs/magrpo/tiny.yaml`` logs the same evaluation numbers (same items, same
samples per item, same seeds), before and after training."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml
from conftest import cpu_trainer_kwargs

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"max_new_tokens": 4, "eval_num_samples": 2, "eval_interval": 2, "num_generations": 4}


def _yaml_evals(tmp_path, monkeypatch, method: str, args: dict, extra: list[str]) -> list[float]:
    """The eval/reward_mean rows of ``configs/<method>/tiny.yaml`` run through the CLI with ``args`` overrides."""
    from comlrl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(ROOT / "configs" / method / "tiny.yaml"), "--trainer.enable_progress_bar=false",
          "--trainer.enable_model_summary=false", *extra, *[f"--model.init_args.args.{k}={v}" for k, v in args.items()]])
    run = tmp_path / "outputs" / f"{method}_tiny" / "lightning_logs" / "version_0"
    with open(run / "metrics.csv") as f:
        return [float(r["eval/reward_mean"]) for r in csv.DictReader(f) if r.get("eval/reward_mean")]


def test_magrpo_facade_and_yaml_report_the_same_evaluations(tmp_path, monkeypatch):
    from comlrl_lightning.config import MAGRPOConfig
    from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    config = ROOT / "configs" / "magrpo" / "tiny.yaml"
    yaml_evals = _yaml_evals(tmp_path, monkeypatch, "magrpo", SMALL, ["--trainer.limit_train_batches=4"])

    args = {**yaml.safe_load(config.read_text())["model"]["init_args"]["args"], **SMALL}
    tr = MAGRPOTrainer(agent_model="embedded:tiny", train_dataset="builtin:cooperative",
                       eval_dataset="builtin:cooperative_eval", reward_func=cooperative_reward, formatters=FORMATTERS,
                       args=MAGRPOConfig(**args), trainer_kwargs=cpu_trainer_kwargs(limit_train_batches=4))
    tr.train()
    facade_evals = [m["eval/reward_mean"] for _, m in tr.evaluation.history]
    assert len(yaml_evals) == 3  # updates 0 and 2, and the end
    assert facade_evals == pytest.approx(yaml_evals, abs=1e-9)


MADPO_SMALL = {"max_new_tokens": 4, "eval_num_samples": 2, "eval_interval": 2, "num_train_epochs": 1,
               "preference_num_candidates": 4, "preference_pairs_per_sample": 2, "train_batch_size": 4}


def test_madpo_facade_and_yaml_report_the_same_evaluations(tmp_path, monkeypatch):
    """The Quick start's job (configs/madpo/tiny.yaml, made small) from YAML and through ``MADPOTrainer``: the same
    evaluation numbers (the facade samples as many responses per eval item as the config)."""
    from comlrl_lightning.config import MADPOConfig
    from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
    from comlrl_lightning.trainers.madpo import MADPOTrainer

    config = ROOT / "configs" / "madpo" / "tiny.yaml"
    yaml_evals = _yaml_evals(tmp_path, monkeypatch, "madpo", MADPO_SMALL,
                             ["--data.init_args.train_dataset=builtin:cooperative[:6]"])

    args = {**yaml.safe_load(config.read_text())["model"]["init_args"]["args"], **MADPO_SMALL}
    tr = MADPOTrainer(agent_model="embedded:tiny", train_dataset="builtin:cooperative[:6]",
                      eval_dataset="builtin:cooperative_eval", reward_func=cooperative_reward, formatters=FORMATTERS,
                      args=MADPOConfig(**args), trainer_kwargs=cpu_trainer_kwargs())
    tr.train()
    facade_evals = [m["eval/reward_mean"] for _, m in tr.evaluation.history]
    assert len(yaml_evals) >= 2 and tr.trainer.global_step > 0  # before the first update and at the end
    assert facade_evals == pytest.approx(yaml_evals, abs=1e-9)


def _config_samples_per_item(relpath: str) -> int:
    callbacks = yaml.safe_load((ROOT / "configs" / relpath).read_text())["trainer"]["callbacks"]
    (evaluation,) = [cb for cb in callbacks if cb["class_path"].endswith("TaskRewardEvaluation")]
    return evaluation["init_args"]["samples_per_item"]


def test_preference_facades_evaluate_with_their_configs_samples_per_item():
    """Each preference facade's evaluation callback samples as many responses per eval item as its shipped config."""
    from comlrl_lightning.config import MADPOConfig, MADPOIterConfig, MARLHFConfig, MARLHFIterConfig
    from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
    from comlrl_lightning.trainers.madpo import MADPOIterTrainer, MADPOTrainer
    from comlrl_lightning.trainers.marlhf import MARLHFIterTrainer, MARLHFTrainer

    cases = [(MADPOTrainer, MADPOConfig, "madpo/tiny.yaml"), (MADPOIterTrainer, MADPOIterConfig,
                                                               "madpo/iterative_tiny.yaml"),
             (MARLHFTrainer, MARLHFConfig, "marlhf/tiny.yaml"), (MARLHFIterTrainer, MARLHFIterConfig,
                                                                 "marlhf/iterative_tiny.yaml")]
    for trainer_cls, config_cls, relpath in cases:
        tr = trainer_cls(agent_model="embedded:tiny", train_dataset="builtin:cooperative",
                         eval_dataset="builtin:cooperative_eval", reward_func=cooperative_reward,
                         formatters=FORMATTERS, args=config_cls(num_agents=2), trainer_kwargs=cpu_trainer_kwargs())
        assert tr.evaluation.samples_per_item == _config_samples_per_item(relpath), trainer_cls.__name__
