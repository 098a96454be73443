"""CoMLRL arguments that used to be refused or silently ignored (docs/coming-from-comlrl.md): eval_logger /
eval_aggregator, external_transition on the preference trainers, train(**generate_kwargs), logging_steps,
eval_batch_size, token-counted eval lengths, log_reward_distribution in MARLHFIter."""

from __future__ import annotations

import csv
import warnings

import pytest
from conftest import cpu_trainer_kwargs
from lightning.pytorch.loggers import CSVLogger

import comlrl_lightning.evaluation as evaluation
from comlrl_lightning.config import MADPOConfig, MAGRPOConfig, MARLHFIterConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.generation import Samples, SamplingSettings
from comlrl_lightning.rewards import RewardOracle, set_reward_range
from comlrl_lightning.trainers.marlhf import MARLHFIterTrainer
from comlrl_lightning.trainers.preference import MADPOTrainer
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

ITEMS = [{"prompt": "Say hi."}, {"prompt": "Say bye."}, {"prompt": "Count."}]
TINY = {"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0, "top_k": None}


def madpo_args(**kw):
    return MADPOConfig(**{"num_train_epochs": 1, "preference_num_candidates": 2, "preference_pairs_per_sample": 1,
                          "eval_interval": 0, "eval_num_samples": 2, **TINY, **kw})


def length_reward(c1, c2):
    return [float(len(a) - len(b)) for a, b in zip(c1, c2)]


def _logger(agent_completions_turns, batch_items, prompts):
    assert len(agent_completions_turns) == 2 and len(batch_items) == len(prompts)
    return [{"chars": float(sum(len(agent_completions_turns[a][k][0]) for a in range(2)))}
            for k in range(len(prompts))]


def _aggregator(metrics, num_turns):
    return {f"turn_{num_turns}/domain_metric": 1.0, "turn_1/chars_mean": sum(m["chars"] for m in metrics) / len(metrics)}


def test_eval_logger_and_aggregator_metrics_are_logged_under_eval(tiny_model_dir):
    tr = MADPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, eval_dataset=ITEMS, reward_func=length_reward,
                      args=madpo_args(), eval_logger=_logger, eval_aggregator=_aggregator,
                      trainer_kwargs=cpu_trainer_kwargs())
    metrics = tr.train()
    assert metrics["eval/turn_1/domain_metric"] == 1.0
    assert "eval/turn_1/chars_mean" in metrics


def test_magrpo_takes_eval_logger_and_forwards_train_kwargs_to_generate(tiny_model_dir):
    args = MAGRPOConfig(num_train_epochs=1, num_generations=2, eval_interval=0, eval_num_samples=2, **TINY)
    tr = MAGRPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS[:1], eval_dataset=ITEMS,
                       reward_func=length_reward, args=args, eval_logger=_logger, eval_aggregator=_aggregator,
                       trainer_kwargs=cpu_trainer_kwargs())
    metrics = tr.train(max_new_tokens=1, do_sample=False)  # CoMLRL: extra train() kwargs go to generate
    assert metrics["eval/turn_1/domain_metric"] == 1.0
    assert tr.module.sampling_settings().extra == {"max_new_tokens": 1, "do_sample": False}
    for i in range(2):  # one token at most (do_sample is stripped: sampling stays on)
        assert metrics[f"eval/agent{i}/completions/mean_length"] <= 1.0


def test_preference_trainers_accept_external_transition_with_a_warning(tiny_model_dir):
    with pytest.warns(UserWarning, match="external_transition has no effect"):
        MADPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=length_reward, args=madpo_args(),
                     external_transition=lambda **kw: ["a", "b"], trainer_kwargs=cpu_trainer_kwargs())


def test_eval_options_without_eval_data_warn_naming_them(tiny_model_dir):
    with pytest.warns(UserWarning, match="eval_batch_size=3 has no effect without an eval_dataset"):
        MADPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=length_reward,
                     args=madpo_args(eval_batch_size=3), trainer_kwargs=cpu_trainer_kwargs())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # defaults: nothing to say
        MADPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=length_reward,
                     args=madpo_args(eval_num_samples=4), trainer_kwargs=cpu_trainer_kwargs())


def _fake_sampling(calls):
    def sample_team(team, prompts, num_candidates, settings, streams):
        calls.append(len(prompts[0]))
        return [Samples(prompt_ids=[[1]] * len(prompts[a]),
                        completion_ids=[[[5, 6]] * num_candidates for _ in prompts[a]],
                        texts=[["abcdefgh"] * num_candidates for _ in prompts[a]]) for a in range(team.num_agents)]
    return sample_team


class _Team:
    num_agents = 2


def test_eval_batch_size_chunks_generation_and_lengths_count_tokens(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(evaluation, "sample_team", _fake_sampling(calls))
    items = [{"prompt": f"p{i}"} for i in range(5)]
    out = evaluation.evaluate_team(_Team(), items, FORMATTERS, RewardOracle(cooperative_reward), SamplingSettings(),
                                   0, batch_size=2)
    assert calls == [2, 2, 1]
    assert out["eval/agent0/completions/mean_length"] == 2.0  # tokens, not the 8 characters
    assert out.completions[1][4] == ["abcdefgh"] and out.raw_prompts[4] == "p4"


def _rows(path, key):
    with open(path) as f:
        return [r for r in csv.DictReader(f) if r.get(key)]


def test_madpo_logging_steps_gates_training_metrics(tiny_model_dir, tmp_path):
    counts = {}
    for steps in (1, 1000):
        logger = CSVLogger(str(tmp_path), name=f"s{steps}")
        tr = MADPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=length_reward,
                          args=madpo_args(logging_steps=steps, num_train_epochs=2, train_batch_size=1),
                          trainer_kwargs=cpu_trainer_kwargs(logger=logger))
        tr.train()
        counts[steps] = len(_rows(f"{logger.log_dir}/metrics.csv", "train/loss"))
    assert counts[1] >= 2 and counts[1000] == 1  # the first log always passes


def test_marlhf_iter_reads_log_reward_distribution(tiny_model_dir):
    from comlrl_lightning.callbacks import RewardDistributionLogger

    args = MARLHFIterConfig(num_iterations=1, num_generations=2, preference_num_candidates=2,
                            reward_model_name=tiny_model_dir, log_reward_distribution=True, **TINY)
    with pytest.raises(ValueError, match="reward_range"):
        MARLHFIterTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=length_reward, args=args,
                          trainer_kwargs=cpu_trainer_kwargs())
    ranged = set_reward_range(lambda c1, c2: length_reward(c1, c2), -10.0, 10.0)
    tr = MARLHFIterTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=ranged, args=args,
                           trainer_kwargs=cpu_trainer_kwargs())
    assert any(isinstance(cb, RewardDistributionLogger) for cb in tr.trainer.callbacks)


def test_eval_batch_size_in_multi_turn_warns_naming_it(tiny_model_dir):
    args = MAGRPOConfig(num_turns=2, num_generations=2, eval_batch_size=2, **TINY)
    with pytest.warns(UserWarning, match="eval_batch_size=2 has no effect with num_turns=2"):
        MAGRPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, eval_dataset=ITEMS, reward_func=length_reward,
                      external_transition=lambda prompt, agent_completions, num_agents, **kw: [prompt] * num_agents,
                      args=args, trainer_kwargs=cpu_trainer_kwargs())
