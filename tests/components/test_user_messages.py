"""Messages that say what is wrong: a missing local folder is not a hub problem, a missing prompt field names
data.prompt_field, a constant reward that yields no pairs says so."""

from __future__ import annotations

import pytest


def test_missing_local_folder_is_reported_as_such(tmp_path):
    from comlrl_lightning.agents import ModelLoadError, load_model

    for source in (str(tmp_path / "no_such_model"), "./runs/agents/agent_0", "outputs/madpo_tiny/agents/agent_0"):
        with pytest.raises(ModelLoadError, match="no such local folder") as exc:
            load_model(source)
        assert "hub is not reachable" not in str(exc.value)
        assert "HF_HUB_OFFLINE" not in str(exc.value)


def test_missing_prompt_field_names_the_option():
    from comlrl_lightning.data.sources import build_formatters, format_prompts

    with pytest.raises(ValueError, match=r"data\.prompt_field.*'prompt'") as exc:
        format_prompts([{"question": "2+2?"}], build_formatters(None, 2))
    assert "--data.init_args.prompt_field=question" in str(exc.value)


def test_constant_reward_warns_that_no_pairs_were_collected(tiny_model_dir, tmp_path):
    from iterative_helpers import iter_args, make_trainer

    def constant(c1, c2):
        return [1.0] * len(c1)

    trainer = make_trainer(tiny_model_dir, tmp_path, args=iter_args(num_iterations=1), num_items=2,
                           reward_func=constant)
    with pytest.warns(UserWarning, match="Round 0: 0 preference pairs.*constant"):
        trainer.train()
