"""BestAgents keeps the weights of the best task-reward evaluation: ``best.json`` holds the best value of the run's
evaluations, and the saved agents, evaluated again with the same settings, score exactly that value."""

from __future__ import annotations

import json

import lightning as L
import pytest
from conftest import cpu_trainer_kwargs

from comlrl_lightning.callbacks import TaskRewardEvaluation
from comlrl_lightning.callbacks.best_agents import BestAgents
from comlrl_lightning.config import MAGRPOConfig
from comlrl_lightning.data.sources import load_task_items
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.modules.magrpo import MAGRPOModule
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer


def _run(tiny_model_dir, root, seed):
    args = MAGRPOConfig(num_train_epochs=1, num_generations=4, max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=None,
                        agent_learning_rate=3e-2, eval_interval=2, eval_num_samples=3, seed=seed)
    best = BestAgents(dirname=str(root / "best"))
    tr = MAGRPOTrainer(agent_model=tiny_model_dir, train_dataset=load_task_items("builtin:cooperative")[:8],
                       eval_dataset=load_task_items("builtin:cooperative_eval"), reward_func=cooperative_reward,
                       formatters=FORMATTERS, args=args, callbacks=[best], trainer_kwargs=cpu_trainer_kwargs())
    tr.train()
    return tr, args, [m["eval/reward_mean"] for _, m in tr.evaluation.history]


def test_the_best_evaluation_is_kept_and_its_weights_reproduce_it(tiny_model_dir, tmp_path):
    # the first seed whose best evaluation is not its last, so that keeping the last agents (ExportAgents) would
    # lose it (measured: seeds 2 and 4 of 0-4; seed 2: 0.937 0.909 1.075 1.142 1.095)
    for seed in range(5):
        root = tmp_path / f"seed{seed}"
        tr, args, values = _run(tiny_model_dir, root, seed)
        assert len(values) == 5  # updates 0, 2, 4, 6 and the end
        record = json.loads((root / "best" / "best.json").read_text())
        assert record["value"] == max(values) and record["monitor"] == "eval/reward_mean"
        assert values.index(max(values)) == [u for u, _ in tr.evaluation.history].index(record["update"])
        if values[-1] < max(values):
            break
    else:
        pytest.fail("on seeds 0-4 the last evaluation was always the best: the test shows nothing")
    # the saved weights are the evaluated ones: the same evaluation gives the same number
    again = MAGRPOModule(agent_model=str(root / "best"), args=args)
    items = tr.datamodule.eval_items[: args.eval_num_samples]
    redo = again.evaluate(items, tr.datamodule, seed=tr.evaluation.seed,
                          samples_per_item=tr.evaluation.samples_per_item)
    assert redo["eval/reward_mean"] == pytest.approx(record["value"], abs=1e-9)


def test_it_must_follow_the_evaluation_and_checks_its_options():
    cb = BestAgents()
    trainer = L.Trainer(callbacks=[cb, TaskRewardEvaluation()], logger=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match="needs a TaskRewardEvaluation listed before it"):
        cb.setup(trainer, None, "fit")
    with pytest.raises(ValueError, match="mode must be 'max' or 'min'. Got 'best'"):
        BestAgents(mode="best")
