"""The code environment end to end: 2-turn MAGRPO with the level_feedback transition on the tiny model."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from conftest import cpu_trainer_kwargs

from comlrl_lightning.config.magrpo import MAGRPOConfig
from comlrl_lightning.data.sources import load_task_items
from comlrl_lightning.envs.code import FORMATTERS, code_reward_func, make_code_transition
from comlrl_lightning.envs.code.sandbox import unavailable_reason
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

ROOT = Path(__file__).resolve().parents[2]
_NO_SANDBOX = unavailable_reason()
pytestmark = pytest.mark.skipif(_NO_SANDBOX is not None, reason=f"no sandbox here: {_NO_SANDBOX}")


class Spy:
    """Records every transition call and what it returned."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __call__(self, prompt, agent_completions, num_agents, prompt_history_per_agent=None,
                 response_history_per_agent=None):
        out = self.inner(prompt, agent_completions, num_agents, prompt_history_per_agent=prompt_history_per_agent,
                         response_history_per_agent=response_history_per_agent)
        self.calls.append((prompt, list(agent_completions), out))
        return out


def test_two_turn_magrpo_with_level_feedback(tiny_model_dir):
    items = load_task_items("builtin:code")[:2]
    spy = Spy(make_code_transition("level_feedback", problems=items, timeout_s=2.0))
    args = MAGRPOConfig(num_turns=2, num_generations=2, joint_mode="aligned", max_new_tokens=16,
                        temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-3, num_train_epochs=1,
                        rollout_buffer_size=2, eval_interval=0, eval_num_samples=1, seed=0,
                        logging_steps=1)
    tr = MAGRPOTrainer(agent_model=tiny_model_dir, train_dataset=items, eval_dataset=items[:1],
                       reward_func=code_reward_func, formatters=FORMATTERS, external_transition=spy, args=args,
                       trainer_kwargs=cpu_trainer_kwargs())
    metrics = tr.train()
    # aligned, K=2: per item 2 joint actions at turn 1, each transitioned once; plus the final evaluation's paths
    # on the one eval item (one per evaluation sample: the facade's samples_per_item, 8 as in the YAML configs)
    assert tr.evaluation.samples_per_item == 8
    assert len(spy.calls) == 2 * len(items) + tr.evaluation.samples_per_item
    for _prompt, completions, (aux_prompt, main_prompt) in spy.calls:
        assert len(completions) == 2
        # level_feedback reports the static checks and the sandboxed test outcome to each agent
        assert "aux" in aux_prompt and ("Tests:" in main_prompt or "not found" in main_prompt
                                        or "SyntaxError" in main_prompt or "syntax" in main_prompt.lower())
    assert "turn_2/reward_mean" in metrics and "eval/turn_2/reward_mean" in metrics


@pytest.mark.parametrize("name", ["code_level_feedback_tiny", "code_plain_tiny"])
def test_code_configs_run_from_the_cli(name, tmp_path, monkeypatch):
    from comlrl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(ROOT / f"configs/magrpo/{name}.yaml"), "--trainer.limit_train_batches=2",
          "--trainer.enable_progress_bar=false", "--model.init_args.args.max_new_tokens=8"])
    (metrics,) = tmp_path.glob(f"outputs/magrpo_{name}/lightning_logs/version_*/metrics.csv")
    with open(metrics) as f:
        rewards = [float(row["eval/reward_mean"]) for row in csv.DictReader(f) if row.get("eval/reward_mean")]
    assert rewards and all(r == 0.0 for r in rewards)  # the config header's "Expect task reward 0 -> 0" on tiny
