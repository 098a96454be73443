"""A command-line override of one field of a config union (MADPOModule's ``args: MADPOConfig | MADPOIterConfig``)
makes jsonargparse re-read ``args`` from the override alone and reset the fields only the iterative config has: the
CLI warns, naming the lost fields and the fix, and the fix (a second config file) keeps them."""

from __future__ import annotations

import pytest

from comlrl_lightning.cli import main

ITERATIVE = "configs/madpo/iterative_tiny.yaml"


def test_an_override_that_drops_iterative_fields_is_named(tmp_path):
    from pathlib import Path

    config = str(Path(__file__).resolve().parents[2] / ITERATIVE)
    with pytest.warns(UserWarning, match=r"model.init_args.args lost .*comparator_policy.*num_iterations.*"
                                         r"--config override.yaml") as caught, pytest.raises(SystemExit) as stop:
        main(["fit", "--config", config, "--model.init_args.args.max_new_tokens=4", "--trainer.max_epochs=0",
              f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", "--trainer.callbacks=[]"])
    assert stop.value.code == 3  # max_epochs=0 trains nothing
    assert len([w for w in caught if "lost" in str(w.message)]) == 1


def test_a_second_config_file_keeps_every_field(tmp_path, capsys):
    from pathlib import Path

    config = str(Path(__file__).resolve().parents[2] / ITERATIVE)
    override = tmp_path / "override.yaml"
    override.write_text("model:\n  init_args:\n    args:\n      max_new_tokens: 4\n")
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", config, "--config", str(override), "--print_config"])
    assert stop.value.code in (0, None)
    out = capsys.readouterr().out
    assert "max_new_tokens: 4" in out and "num_iterations: 3" in out and "comparator_policy: history" in out


def test_a_single_type_args_takes_command_line_overrides(tmp_path, capsys):
    """MAGRPOModule's args has one type: an override is applied and nothing is refused."""
    from pathlib import Path

    from comlrl_lightning.trainers.common import check_args_kept

    config = str(Path(__file__).resolve().parents[2] / "configs/magrpo/tiny.yaml")
    with pytest.raises(SystemExit):
        main(["fit", "--config", config, "--model.init_args.args.max_new_tokens=5", "--print_config"])
    out = capsys.readouterr().out
    assert "max_new_tokens: 5" in out and "num_generations" in out
    check_args_kept({"model": {"init_args": {"args": None}}})  # nothing parsed: nothing to check
