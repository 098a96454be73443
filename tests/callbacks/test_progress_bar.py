"""Counts in the progress bar read as integers (``pairs=310``, not ``pairs=310.000``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

from comlrl_lightning.callbacks.progress import TeamProgressBar, integral_counts, with_progress_bar

ROOT = Path(__file__).resolve().parents[2]


def test_integral_counts_turns_only_integral_counts_into_ints():
    out = integral_counts({"pairs": 424.0, "loss": 2.0, "env_step": 7.5, "v_num": 0}, ["pairs", "env_step"])
    assert out == {"pairs": 424, "loss": 2.0, "env_step": 7.5, "v_num": 0}
    assert type(out["pairs"]) is int and type(out["loss"]) is float
    # what the bar prints: Lightning pads floats to a fixed width, ints stay as they are
    assert Tqdm.format_num(out["pairs"]) == "424" and Tqdm.format_num(424.0).startswith("424.")


def test_the_bar_shows_counts_as_integers():
    class Trainer:
        loggers = []  # no logger: no v_num
        progress_bar_metrics = {"pairs": 310.0, "loss": 0.5}

    assert TeamProgressBar().get_metrics(Trainer(), None) == {"pairs": 310, "loss": 0.5}


def test_with_progress_bar_adds_one_only_when_enabled_and_none_given():
    assert isinstance(with_progress_bar([], True)[-1], TeamProgressBar)
    assert with_progress_bar([], False) == []
    own = TQDMProgressBar()
    assert with_progress_bar([own], True) == [own]


@pytest.mark.parametrize("flag, expected", [([], TeamProgressBar), (["--trainer.enable_progress_bar=false"], None)])
def test_cli_trainer_gets_the_team_bar_unless_disabled(flag, expected, tmp_path, monkeypatch):
    from comlrl_lightning.cli import _make_cli_class

    monkeypatch.chdir(tmp_path)
    cli_cls, L = _make_cli_class()
    cli = cli_cls(L.LightningModule, L.LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                  auto_configure_optimizers=False, save_config_callback=None, parser_class=cli_cls.parser_cls,
                  run=False, args=["--config", str(ROOT / "configs/madpo/tiny.yaml"), *flag])
    bar = cli.trainer.progress_bar_callback
    assert (bar is None) if expected is None else type(bar) is expected
