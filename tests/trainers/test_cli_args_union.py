"""A command-line override of one field of a config union (MADPOModule's ``args: MADPOConfig | MADPOIterConfig``,
MARLHF's likewise) changes that field only: the CLI gives it to jsonargparse as a one-field mapping, merged with the
config read so far (``args_overrides_merged``), so the iterative fields of the YAML are kept. ``check_args_kept``
stays as the safety net: it warns, naming the lost fields and the fix, when a parse drops fields all the same."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from comlrl_lightning.cli import args_overrides_merged, main

ROOT = Path(__file__).resolve().parents[2]
ITERATIVE = "configs/madpo/iterative_tiny.yaml"


def _printed_args(capsys, argv: list[str]) -> dict:
    """``model.init_args.args`` as ``fit --print_config`` prints it for ``argv``."""
    with pytest.raises(SystemExit) as stop:
        main(["fit", *argv, "--print_config"])
    assert stop.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]["args"]


def test_one_field_overrides_become_mappings_in_place():
    assert args_overrides_merged(["fit", "--config", "c.yaml", "--model.init_args.args.max_new_tokens=4",
                                  "--model.args", "{a: 1}", "--model.args.temperature", "0.5",
                                  "--model.init_args.args.init_args.comparator_api_key=k=v", "--seed_everything=1"]) \
        == ["fit", "--config", "c.yaml", "--model.init_args.args", '{"max_new_tokens": "4"}',
            "--model.args", "{a: 1}", "--model.init_args.args", '{"temperature": "0.5"}',
            "--model.init_args.args", '{"comparator_api_key": "k=v"}', "--seed_everything=1"]
    kept = ["--model.init_args.args.vllm_kwargs.x=1", "--model.args.help", "MADPOConfig",
            "--model.init_args.agent_model=x", "--data.init_args.args.seed=1", "--model.args.seed", "--print_config",
            "--model.init_args.args.seed"]
    assert args_overrides_merged(kept) == kept  # deeper keys, help, other options, a value missing: as given


@pytest.mark.parametrize("config", [ITERATIVE, "configs/marlhf/iterative_tiny.yaml"])
def test_a_command_line_override_changes_only_its_field(config, capsys):
    path = str(ROOT / config)
    before = _printed_args(capsys, ["--config", path])
    after = _printed_args(capsys, ["--config", path, "--model.init_args.args.max_new_tokens=4",
                                   "--model.args.temperature", "0.5"])
    given = yaml.safe_load(Path(path).read_text())["model"]["init_args"]["args"]
    assert "num_iterations" in given and "preference_replay_mode" in given  # an iterative config
    assert {k: v for k, v in before.items() if k in given} == given  # the YAML as parsed, defaults added
    assert after == {**before, "max_new_tokens": 4, "temperature": 0.5}  # every other field as the YAML has it
    assert before["max_new_tokens"] != 4 and before["temperature"] != 0.5


def test_an_iterative_fit_with_an_override_warns_nothing(tmp_path):
    config = str(ROOT / ITERATIVE)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(SystemExit) as stop:
        warnings.simplefilter("always")
        main(["fit", "--config", config, "--model.init_args.args.max_new_tokens=4", "--trainer.max_epochs=0",
              f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", "--trainer.callbacks=[]"])
    assert stop.value.code == 3  # max_epochs=0 trains nothing
    assert not [w for w in caught if str(w.message).startswith("model.init_args.args lost")]


def test_the_safety_net_names_dropped_fields_and_the_fix(tmp_path):
    """A parse that dropped fields of the config file all the same (e.g. a key inside a field,
    ``--model.init_args.args.vllm_kwargs.x=1``, which the CLI leaves as given) is named."""
    from jsonargparse import Namespace

    from comlrl_lightning.trainers.common import check_args_kept

    config = str(ROOT / ITERATIVE)
    dropped = {"model": {"init_args": {"args": Namespace(max_new_tokens=4, num_agents=2)}}, "config": [config]}
    with pytest.warns(UserWarning, match=r"model.init_args.args lost .*comparator_policy.*num_iterations.*"
                                         r"--config override.yaml"):
        check_args_kept(dropped)
    given = yaml.safe_load(Path(config).read_text())["model"]["init_args"]["args"]
    kept = {"model": {"init_args": {"args": Namespace(**given)}}, "config": [config]}
    named = tmp_path / "named.yaml"  # the type named with class_path: its fields are checked all the same
    named.write_text(yaml.safe_dump({"model": {"init_args": {"args": {
        "class_path": "comlrl_lightning.config.MADPOIterConfig", "init_args": given}}}}))
    with pytest.warns(UserWarning, match=r"model.init_args.args lost .*comparator_policy.*num_iterations"):
        check_args_kept({**dropped, "config": [str(named)]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_args_kept(kept)  # nothing lost: no warning
        check_args_kept({"model": {"init_args": {"args": Namespace(class_path="x", init_args=Namespace(**given))}},
                         "config": [str(named)]})
        check_args_kept({"model": {"init_args": {"args": None}}})  # nothing parsed: nothing to check


def test_a_second_config_file_keeps_every_field(tmp_path, capsys):
    config = str(ROOT / ITERATIVE)
    override = tmp_path / "override.yaml"
    override.write_text("model:\n  init_args:\n    args:\n      max_new_tokens: 4\n")
    args = _printed_args(capsys, ["--config", config, "--config", str(override)])
    assert args["max_new_tokens"] == 4 and args["num_iterations"] == 3 and args["comparator_policy"] == "history"


def test_a_single_type_args_takes_command_line_overrides(capsys):
    """MAGRPOModule's args has one type: an override is applied and nothing is refused."""
    args = _printed_args(capsys, ["--config", str(ROOT / "configs/magrpo/tiny.yaml"),
                                  "--model.init_args.args.max_new_tokens=5"])
    assert args["max_new_tokens"] == 5 and "num_generations" in args


@pytest.mark.parametrize("form", ["plain", "class_path"])
def test_a_bad_value_of_an_iterative_config_is_named_not_the_other_type(form, tmp_path, capsys):
    """Building a union's args tries every type and jsonargparse reports the first one's error ("MADPOConfig has no
    option 'num_iterations'"): the CLI names the error of the type meant instead."""
    config = yaml.safe_load((ROOT / ITERATIVE).read_text())
    if form == "class_path":
        args = config["model"]["init_args"]["args"]
        config["model"]["init_args"]["args"] = {"class_path": "comlrl_lightning.config.MADPOIterConfig",
                                                "init_args": args}
    config["trainer"].update(logger=False, callbacks=[], max_epochs=0, default_root_dir=str(tmp_path))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(path), "--model.init_args.args.max_new_tokens=0"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "error: max_new_tokens must be >= 1. Got 0." in err and "has no option" not in err, err[-2000:]
