"""An unknown option name gets "did you mean" with the closest options, from Python and from the CLI (the
sentence leads the CLI's output instead of following the usage and the Union-subtype report)."""

from __future__ import annotations

from pathlib import Path

import pytest

from comlrl_lightning.config import IACConfig, MADPOConfig, MAGRPOConfig, MARLHFIterConfig
from comlrl_lightning.config.checks import did_you_mean

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("cls, given, expect", [
    (MAGRPOConfig, "learning_rate", "MAGRPOConfig has no option 'learning_rate'. Did you mean agent_learning_rate?"),
    (MADPOConfig, "beta", "MADPOConfig has no option 'beta'. Did you mean dpo_beta?"),
    (IACConfig, "num_turn", "IACConfig has no option 'num_turn'. Did you mean num_turns"),
    (MARLHFIterConfig, "replay_mode", "Did you mean preference_replay_mode?"),
])
def test_python_configs_suggest_the_closest_option(cls, given, expect):
    with pytest.raises(TypeError) as exc:
        cls(**{given: 1})
    assert expect in str(exc.value)


def test_no_suggestion_when_nothing_is_close():
    assert did_you_mean("zzz", ["num_turns", "dpo_beta"]) == ""
    with pytest.raises(TypeError, match=r"^MADPOConfig has no option 'zzz'\.$"):
        MADPOConfig(zzz=1)


def test_copies_and_known_options_still_work():
    import copy
    import dataclasses
    import pickle

    cfg = MAGRPOConfig(num_turns=2, agent_learning_rate=1e-3)
    assert copy.deepcopy(cfg) == cfg == pickle.loads(pickle.dumps(cfg))
    assert dataclasses.replace(cfg, num_turns=1).num_turns == 1


@pytest.mark.parametrize("option, sentence", [
    ("--model.init_args.args.learning_rate=0.1",
     "error: MAGRPOConfig has no option 'learning_rate'. Did you mean agent_learning_rate?"),
    ("--model.init_args.agent_modle=x", "error: MAGRPOModule has no option 'agent_modle'. Did you mean agent_model?"),
])
def test_the_cli_leads_with_the_suggestion(option, sentence, capsys):
    from comlrl_lightning.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(ROOT / "configs/magrpo/tiny.yaml"), option])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[0] == sentence
