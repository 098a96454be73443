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


def test_magrpo_facade_and_yaml_report_the_same_evaluations(tmp_path, monkeypatch):
    from comlrl_lightning.cli import main
    from comlrl_lightning.config import MAGRPOConfig
    from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    config = ROOT / "configs" / "magrpo" / "tiny.yaml"
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(config), "--trainer.enable_progress_bar=false",
          "--trainer.enable_model_summary=false", "--trainer.limit_train_batches=4",
          *[f"--model.init_args.args.{k}={v}" for k, v in SMALL.items()]])
    run = tmp_path / "outputs" / "magrpo_tiny" / "lightning_logs" / "version_0"
    with open(run / "metrics.csv") as f:
        yaml_evals = [float(r["eval/reward_mean"]) for r in csv.DictReader(f) if r.get("eval/reward_mean")]

    args = {**yaml.safe_load(config.read_text())["model"]["init_args"]["args"], **SMALL}
    tr = MAGRPOTrainer(agent_model="embedded:tiny", train_dataset="builtin:cooperative",
                       eval_dataset="builtin:cooperative_eval", reward_func=cooperative_reward, formatters=FORMATTERS,
                       args=MAGRPOConfig(**args), trainer_kwargs=cpu_trainer_kwargs(limit_train_batches=4))
    tr.train()
    facade_evals = [m["eval/reward_mean"] for _, m in tr.evaluation.history]
    assert len(yaml_evals) == 3  # updates 0 and 2, and the end
    assert facade_evals == pytest.approx(yaml_evals, abs=1e-9)
