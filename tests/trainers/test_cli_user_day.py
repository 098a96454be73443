"""A user's day with the CLI: fit a tiny MADPO run, find what it trained in the run's own folder (agents with
a model card and their sampling settings, config.yaml, a yaml.safe_load-able hparams.yaml), evaluate the
exported team with ``validate``, feed the saved config back, and plot the run with ``report``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
# a short run of configs/madpo/tiny.yaml
SMALL = ["--model.init_args.args.num_train_epochs=1", "--model.init_args.args.preference_num_candidates=4",
         "--model.init_args.args.preference_pairs_per_sample=2", "--model.init_args.args.max_new_tokens=6",
         "--model.init_args.args.eval_num_samples=2", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One short ``fit --config configs/madpo/tiny.yaml``, run twice (two versioned folders)."""
    from comlrl_lightning.cli import main

    work = tmp_path_factory.mktemp("userday")
    old = os.getcwd()
    os.chdir(work)
    try:
        for _ in range(2):
            main(["fit", "--config", str(ROOT / "configs/madpo/tiny.yaml"), *SMALL])
    finally:
        os.chdir(old)
    return work / "outputs/madpo_tiny/lightning_logs"


def test_each_run_exports_into_its_own_versioned_folder(run):
    for version in ("version_0", "version_1"):
        folder = run / version
        assert (folder / "config.yaml").exists()
        for i in (0, 1):
            agent = folder / "agents" / f"agent_{i}"
            assert (agent / "config.json").exists() and (agent / "model.safetensors").exists()
    assert not (run.parent / "agents").exists()  # no fixed, shared output folder


def test_exported_agent_has_a_model_card_and_its_sampling_settings(run):
    agent = run / "version_0" / "agents" / "agent_1"
    card = (agent / "README.md").read_text()
    for needed in ("MADPOModule", "cooperative_reward", "eval/reward_mean", "dpo_beta", "from_pretrained",
                   "builtin:cooperative", "comlrl-lightning validate"):
        assert needed in card, needed
    gen = json.loads((agent / "generation_config.json").read_text())
    assert gen["do_sample"] is True and gen["temperature"] == 1.0 and gen["top_p"] == 1.0
    assert gen["max_new_tokens"] == 6 and gen["top_k"] == 0  # top_k: null in the config = no top-k filtering


def test_hparams_yaml_is_safe_loadable(run):
    hp = yaml.safe_load((run / "version_0" / "hparams.yaml").read_text())
    assert hp["args"]["dpo_beta"] == 0.1 and hp["args"]["num_train_epochs"] == 1


def test_saved_config_reproduces_the_run(run, tmp_path):
    from comlrl_lightning.cli import main

    saved = run / "version_0" / "config.yaml"
    assert "Unable to serialize" not in saved.read_text()
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        main(["fit", "--config", str(saved)])
    finally:
        os.chdir(old)
    save_dir = yaml.safe_load(saved.read_text())["trainer"]["logger"]["init_args"]["save_dir"]
    again = tmp_path / save_dir / "lightning_logs" / "version_0" / "metrics.csv"

    def losses(path):
        import csv

        return [r["train/loss"] for r in csv.DictReader(open(path)) if r.get("train/loss")]

    assert losses(again) == losses(run / "version_0" / "metrics.csv") != []


def test_validate_evaluates_an_exported_team(run, tmp_path, capsys):
    from comlrl_lightning.cli import main

    agents = run / "version_0" / "agents"
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        main(["validate", "--config", str(ROOT / "configs/madpo/tiny.yaml"), *SMALL[-3:],
              f"--model.init_args.agent_model={agents}", "--trainer.logger=false"])
    finally:
        os.chdir(old)
    out = capsys.readouterr().out
    assert "val/reward_mean" in out


def test_predict_is_refused_with_a_message_naming_validate(run, tmp_path):
    from comlrl_lightning.cli import main

    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(NotImplementedError, match="validate"):
            main(["predict", "--config", str(ROOT / "configs/madpo/tiny.yaml"), "--trainer.logger=false",
                  "--trainer.enable_progress_bar=false"])
    finally:
        os.chdir(old)


def test_report_writes_non_empty_pngs(run, tmp_path):
    from comlrl_lightning.cli import main

    main(["report", str(run / "version_0"), "--out", str(tmp_path)])
    for name in ("rewards.png", "losses.png"):
        png = tmp_path / name
        assert png.exists() and png.stat().st_size > 1000
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_config_value_error_is_the_first_and_last_line(capsys):
    from comlrl_lightning.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(ROOT / "configs/madpo/tiny.yaml"), "--model.init_args.args.temperature=0"])
    assert exc.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    sentence = "error: temperature must be > 0. Got 0.0. Allowed: numbers > 0."
    assert lines[-1] == sentence
    assert [line for line in lines if line.startswith("error:")][0] == sentence


def test_top_level_help_is_cheap_and_lists_our_classes(capsys):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "comlrl_lightning", "--help"], cwd=ROOT,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    for name in ("validate", "report", "MADPOModule", "TaskDataModule", "ExportAgents"):
        assert name in out.stdout
    import re

    # -X importtime lists every import: neither Lightning nor torch is loaded
    assert not re.search(r"\|\s+(lightning|torch)(\.|$)", out.stderr, re.M)


def test_fit_help_lists_our_modules_and_docstrings(capsys):
    from comlrl_lightning.cli import main

    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = capsys.readouterr().out
    for name in ("MADPOModule", "MAGRPOModule", "TaskDataModule", "PreferenceDataModule", "ExportAgents",
                 "TaskRewardEvaluation"):
        assert name in text, name
    with pytest.raises(SystemExit):
        main(["fit", "--model", "MADPOModule", "--model.args.help", "MADPOConfig"])
    assert "Sampling temperature for generation and evaluation." in capsys.readouterr().out


def test_callback_metrics_share_the_step_axis_of_training_metrics(run):
    import csv

    rows = list(csv.DictReader(open(run / "version_0" / "metrics.csv")))
    train = [int(r["step"]) for r in rows if r.get("train/loss")]
    evals = [int(r["step"]) for r in rows if r.get("eval/reward_mean")]
    # one step per update (not one per optimizer step of each of the 2 agents): the final evaluation comes
    # right after the last update
    assert evals[0] == 0 and evals[-1] == train[-1] + 1


CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem + "@" + p.parent.name for p in CONFIGS])
def test_every_config_exports_into_the_run_folder_and_logs_every_update(path):
    cfg = yaml.safe_load(path.read_text())
    trainer = cfg["trainer"]
    callbacks = trainer.get("callbacks") or []
    export = [c for c in callbacks if c["class_path"].endswith("ExportAgents")]
    assert len(export) == 1 and "output_dir" not in (export[0].get("init_args") or {})
    assert trainer.get("log_every_n_steps") == 1
    if "num_iterations" in (cfg["model"]["init_args"].get("args") or {}):  # iterative: a checkpoint per round
        assert trainer["enable_checkpointing"] is True
        ckpt = [c for c in callbacks if c["class_path"].endswith("ModelCheckpoint")]
        assert ckpt and ckpt[0]["init_args"]["save_on_train_epoch_end"] is True


@pytest.mark.parametrize("name", ["madpo/iterative_tiny.yaml", "marlhf/iterative_tiny.yaml"])
def test_iterative_printed_config_is_plain_yaml(name, capsys):
    from comlrl_lightning.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(ROOT / "configs" / name), "--print_config"])
    assert exc.value.code == 0
    printed = capsys.readouterr().out
    assert "Unable to serialize" not in printed
    assert any(c["class_path"].endswith("ReplaySelection") for c in yaml.safe_load(printed)["trainer"]["callbacks"])


def test_every_config_class_dumps_to_safe_yaml():
    import comlrl_lightning.config as config
    from comlrl_lightning.config.reward_model import RewardModelOptions

    for cls in (config.MADPOConfig, config.MADPOIterConfig, config.MAGRPOConfig, config.IACConfig, config.MAACConfig,
                config.MARLHFConfig, config.MARLHFIterConfig, RewardModelOptions):
        args = cls()
        loaded = yaml.safe_load(yaml.dump({"args": args}))  # what Lightning's hparams.yaml writer does
        assert loaded["args"]["seed" if hasattr(args, "seed") else "reward_learning_rate"] is not None


def test_reward_model_config_exports_the_fitted_reward_model(tmp_path):
    import torch

    from comlrl_lightning.cli import main

    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        main(["fit", "--config", str(ROOT / "configs/reward_model/tiny.yaml"), "--trainer.limit_train_batches=2",
              "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false"])
    finally:
        os.chdir(old)
    folder = tmp_path / "outputs/reward_model_tiny/lightning_logs/version_0/reward_model"
    assert (folder / "backbone" / "config.json").exists()
    head = torch.load(folder / "head.pt", weights_only=True)
    assert set(head) == {"weight", "bias"}
    options = json.loads((folder / "reward_model.json").read_text())["options"]
    assert options["reward_learning_rate"] == 0.003


def _losses(path):
    import csv

    return [r["train/loss"] for r in csv.DictReader(open(path)) if r.get("train/loss")]


def test_iterative_saved_config_runs_again_past_round_0_and_reproduces(tmp_path):
    """The saved config.yaml of an iterative run (round callbacks, replay, checkpoints) fed back to fit."""
    from comlrl_lightning.cli import main

    small = ["--model.init_args.args.num_iterations=2", "--model.init_args.args.preference_num_candidates=2",
             "--model.init_args.args.preference_pairs_per_sample=1", "--model.init_args.args.max_new_tokens=4",
             "--model.init_args.args.eval_num_samples=2", "--model.init_args.args.preference_replay_sample_size=8",
             "--model.init_args.args.train_batch_size=8", "--trainer.enable_progress_bar=false",
             "--trainer.enable_model_summary=false"]
    old = os.getcwd()
    try:
        os.chdir(tmp_path / ".")
        (tmp_path / "a").mkdir()
        os.chdir(tmp_path / "a")
        main(["fit", "--config", str(ROOT / "configs/madpo/iterative_tiny.yaml"), *small])
        first = tmp_path / "a/outputs/madpo_iterative_tiny/lightning_logs/version_0"
        saved = first / "config.yaml"
        assert "Unable to serialize" not in saved.read_text()
        (tmp_path / "b").mkdir()
        os.chdir(tmp_path / "b")
        main(["fit", "--config", str(saved)])
    finally:
        os.chdir(old)
    second = tmp_path / "b/outputs/madpo_iterative_tiny/lightning_logs/version_0"
    assert (second / "checkpoints" / "last.ckpt").exists()
    replay = [sorted(p.name for p in (tmp_path / run / "outputs/madpo_iterative_tiny/preference_replay").iterdir())
              for run in ("a", "b")]
    assert replay[0] == replay[1] and "iteration_0002.json" in replay[1]  # both rounds ran
    assert _losses(second / "metrics.csv") == _losses(first / "metrics.csv") != []
