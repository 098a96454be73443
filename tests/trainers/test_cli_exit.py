"""``comlrl-lightning fit`` does not look successful when it is not: a fit stopped by SIGTERM exits 143 and a fit
that took no optimizer step exits 3, each after a one-paragraph summary (what was saved, where, how to resume)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import lightning as L
import pytest

from comlrl_lightning.cli import EXIT_SIGTERM, EXIT_TRAINED_NOTHING, main

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


class SigtermAfterFirstBatch(L.Callback):
    """Sends SIGTERM to this process at the end of the first training batch (as a scheduler would)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 0:
            os.kill(os.getpid(), signal.SIGTERM)


def no_preference(completions1, completions2):
    """Every joint response scores the same: no preference, so no pair."""
    return [0.5 for _ in completions1]


def _fit(tmp_path, monkeypatch, config, *extra):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(ROOT / "configs" / config), *QUIET, *extra])
    return exc.value.code


MAGRPO_SMALL = ["--model.init_args.args.max_new_tokens=4", "--model.init_args.args.eval_num_samples=1",
                "--trainer.callbacks+=test_cli_exit.SigtermAfterFirstBatch"]


def test_sigterm_exits_143_with_a_summary_and_no_checkpoint(tmp_path, monkeypatch, capsys):
    code = _fit(tmp_path, monkeypatch, "magrpo/tiny.yaml", *MAGRPO_SMALL)
    err = capsys.readouterr().err
    assert code == EXIT_SIGTERM, err
    assert "stopped by SIGTERM after" in err and "Saved:" in err and "config.yaml" in err
    assert "No checkpoint was written" in err and "comlrl-lightning fit --config" in err
    assert not (tmp_path / "outputs" / "magrpo_tiny" / "lightning_logs" / "version_0" / "agents").exists()


def test_sigterm_summary_names_the_checkpoint_to_resume_from(tmp_path, monkeypatch, capsys):
    code = _fit(tmp_path, monkeypatch, "magrpo/tiny.yaml", *MAGRPO_SMALL, "--trainer.enable_checkpointing=true",
                "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_train_steps=1",
                "--trainer.callbacks.save_last=true", f"--trainer.callbacks.dirpath={tmp_path / 'ckpts'}")
    err = capsys.readouterr().err
    assert code == EXIT_SIGTERM, err
    assert "Resume: comlrl-lightning fit --config " in err and f"--ckpt_path {tmp_path / 'ckpts'}" in err


def test_a_fit_that_trained_nothing_exits_3_with_a_summary(tmp_path, monkeypatch, capsys):
    code = _fit(tmp_path, monkeypatch, "madpo/tiny.yaml", "--trainer.max_epochs=1", "--trainer.limit_train_batches=1",
                "--model.init_args.args.num_train_epochs=1", "--model.init_args.args.max_new_tokens=4",
                "--model.init_args.args.preference_num_candidates=4", "--model.init_args.args.eval_num_samples=1",
                "--data.init_args.reward_func=test_cli_exit.no_preference")
    err = capsys.readouterr().err
    assert code == EXIT_TRAINED_NOTHING, err
    assert "took no optimizer step" in err and "Saved:" in err


def test_a_fit_that_trained_returns_normally(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(ROOT / "configs" / "magrpo" / "tiny.yaml"), *QUIET, "--trainer.limit_train_batches=1",
          "--model.init_args.args.max_new_tokens=4", "--model.init_args.args.eval_num_samples=1"])
