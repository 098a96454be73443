"""Learning tests: MAGRPO raises the task reward of the built-in cooperative task (tiny model, CPU).

Evaluation: the 8 held-out items, 8 sampled joint responses each, fixed evaluation seeds (so "before" is the
same number in every run). Measured spreads and margins are in the comments next to each assertion.
"""

from __future__ import annotations

import pytest
from conftest import cpu_trainer_kwargs
from learning_seed import LEARNING_SEED

from comlrl_lightning.callbacks.evaluation import evaluate_team
from comlrl_lightning.config.magrpo import MAGRPOConfig
from comlrl_lightning.data.sources import load_task_items
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.multiturn.transitions import plain_transition
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

pytestmark = pytest.mark.slow


def _trainer(model_dir, n_items, **kw):
    base = {"num_train_epochs": 1, "num_generations": 8, "num_turns": 1, "max_new_tokens": 16, "temperature": 1.0, "top_p": 1.0,
                "top_k": None, "agent_learning_rate": 1e-2, "rollout_buffer_size": 1, "eval_interval": 0, "eval_num_samples": 0,
                "logging_steps": 1, "seed": LEARNING_SEED}
    base.update(kw)
    args = MAGRPOConfig(**base)
    return MAGRPOTrainer(agent_model=model_dir, train_dataset=load_task_items("builtin:cooperative")[:n_items],
                         reward_func=cooperative_reward, formatters=FORMATTERS, args=args,
                         external_transition=plain_transition if args.num_turns > 1 else None,
                         trainer_kwargs=cpu_trainer_kwargs())


def test_single_turn_magrpo_learns_the_cooperative_task(tiny_model_dir):
    tr = _trainer(tiny_model_dir, 20)
    dm = tr.datamodule
    eval_items = load_task_items("builtin:cooperative_eval")

    def evaluate():
        return evaluate_team(tr.team, eval_items, dm.formatters, dm.oracle, tr.module.sampling_settings(), 12345,
                             8)["eval/reward_mean"]

    before = evaluate()
    tr.train()
    after = evaluate()
    # Measured with seeds 0, 1, 2, 3 (20 items, 40 AdamW steps): before 0.874 (fixed eval seeds), after
    # 1.373 / 1.385 / 1.318 / 1.408, i.e. gains 0.50 / 0.51 / 0.44 / 0.53 (run-to-run std 0.04; the
    # reward's maximum is 1.5). The 0.3 margin is > 3 run-to-run stds below the smallest gain and ~10
    # standard errors of the 64-sample evaluation mean above zero.
    assert after - before > 0.3, (before, after)


def test_two_turn_magrpo_learns_with_the_plain_transition(tiny_model_dir):
    tr = _trainer(tiny_model_dir, 16, num_turns=2, num_generations=4, agent_learning_rate=5e-3)
    dm = tr.datamodule
    eval_items = load_task_items("builtin:cooperative_eval")

    def evaluate():
        return tr.module.evaluate_turns(eval_items, dm.formatters, dm.oracle, plain_transition, samples_per_item=2)

    before = evaluate()
    tr.train()
    after = evaluate()
    # Measured with seeds 0-9 (benchmarks/learning_tests.sh; 16 items, 5 nodes per tree, 160 AdamW steps at lr
    # 5e-3): turn-1 gains +0.60 +0.60 +0.61 +0.50 +0.57 +0.61 +0.33 +0.56 +0.62 +0.49, turn 2 +0.45 to +0.63.
    # 8 items at lr 1e-2 (the earlier recipe) gained only +0.10 on seed 3; 12 or 16 items at 1e-2 fell on seed 7
    # (+0.08, -0.30): too few steps, or too large ones.
    print(f"two-turn MAGRPO seed {LEARNING_SEED}: gains " + " ".join(
        f"turn {t} {after[f'eval/turn_{t}/reward_mean'] - before[f'eval/turn_{t}/reward_mean']:+.3f}" for t in (1, 2)))
    for t in (1, 2):
        key = f"eval/turn_{t}/reward_mean"
        assert after[key] - before[key] > 0.3, (t, before, after)
    assert after["eval/turn_1/expected_return"] > before["eval/turn_1/expected_return"] + 0.6
