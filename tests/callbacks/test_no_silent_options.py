"""Options that would go silent off the facade path are an error or a warning at setup, naming what to add:
``collaboration_mode="centralized"`` on the module/YAML path, ``agent_devices``/``critic_devices`` without
``parallel_training="mp"``, ``log_reward_distribution`` and ``policy_checkpoint_dir`` without their callbacks."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from comlrl_lightning.config import IACConfig, MADPOConfig, MAGRPOConfig, MARLHFConfig

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@pytest.mark.parametrize("make, option", [
    (lambda: MADPOConfig(agent_devices=["cpu", "cpu"]), "agent_devices"),
    (lambda: MAGRPOConfig(agent_devices="cpu"), "agent_devices"),
    (lambda: IACConfig(critic_devices="cpu"), "critic_devices"),
])
def test_devices_without_mp_warn_naming_the_mode_to_set(make, option):
    with pytest.warns(UserWarning, match=rf"{option}=.* has no effect: with parallel_training='none' .*"
                                         r"Set parallel_training='mp'"):
        make()


def test_critic_devices_without_a_critic_warn():
    with pytest.warns(UserWarning, match=r"critic_devices='cpu' has no effect: rl_algorithm='magrpo' has no critic"):
        MARLHFConfig(critic_devices="cpu")


def test_devices_that_take_effect_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MADPOConfig(parallel_training="mp", agent_devices=["cpu", "cpu"])
        IACConfig(parallel_training="mp", agent_devices="cpu", critic_devices="cpu")
        MARLHFConfig(rl_algorithm="iac", num_generations=1, parallel_training="mp", agent_devices="cpu",
                     critic_devices="cpu")
        MADPOConfig(agent_devices="auto")


def _fit_error(config: str, overrides: list[str], tmp_path, monkeypatch, capsys) -> str:
    from comlrl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(ROOT / "configs" / config), *QUIET, *overrides])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert not list(tmp_path.rglob("metrics.csv"))  # refused at setup: nothing was trained or logged
    return next(line for line in err.splitlines() if line.startswith("error: "))


@pytest.mark.parametrize("config, where", [
    ("madpo/tiny.yaml", "PreferenceCollection"),
    ("madpo/iterative_tiny.yaml", "IterativePreferenceCollection"),
    ("marlhf/tiny.yaml", "LearnedRewardFit"),
])
def test_centralized_collaboration_on_the_module_path_is_refused(config, where, tmp_path, monkeypatch, capsys):
    error = _fit_error(config, ["--model.init_args.args.collaboration_mode=centralized"], tmp_path, monkeypatch,
                       capsys)
    assert error.startswith(f"error: {where}: collaboration_mode='centralized' takes effect only through")
    assert "MADPOTrainer" in error and "collaboration_mode='decentralized'" in error


@pytest.mark.parametrize("config, option, callback", [
    ("madpo/iterative_tiny.yaml", "log_reward_distribution=true", "RewardDistributionLogger"),
    ("marlhf/iterative_tiny.yaml", "policy_checkpoint_dir=snapshots", "HistoryCheckpoint"),
])
def test_an_option_without_its_callback_is_refused(config, option, callback, tmp_path, monkeypatch, capsys):
    error = _fit_error(config, [f"--model.init_args.args.{option}"], tmp_path, monkeypatch, capsys)
    assert f"but no {callback} callback is configured, so it would be ignored" in error
    assert f"Add comlrl_lightning.callbacks.{callback} to the Trainer's callbacks" in error
