"""Weight-sync verification (docs/engines.md, "Verification") on the HF engine: the engine reports the log-prob of each
sampled token and the weight version it sampled with; a healthy fit logs a near-zero ``engine/agent_{i}/logprob_gap``;
an engine that samples stale weights, or a sync that was not applied, stops the run naming the agent and step."""

from __future__ import annotations

import pytest
import torch
from conftest import cpu_trainer_kwargs

from comlrl_lightning.agents import build_agents, load_model, load_tokenizer
from comlrl_lightning.config import MAGRPOConfig
from comlrl_lightning.data.sources import load_task_items
from comlrl_lightning.engines.hf import HFEngine
from comlrl_lightning.engines.verify import EngineSyncError
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.generation import SamplingSettings, SamplingStream, sample_completions
from comlrl_lightning.logprobs import build_scoring_batch, scored_token_logps

ITEMS = load_task_items("builtin:cooperative")[:8]



def magrpo(model_dir, **kw):
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    args = MAGRPOConfig(**{"num_train_epochs": 1, "max_new_tokens": 12, "temperature": 1.0, "top_p": 1.0,
                           "top_k": None, "agent_learning_rate": 1e-3, "eval_interval": 0, "eval_num_samples": 1,
                           "num_generations": 4, "rollout_buffer_size": 2, "logging_steps": 1, **kw})
    return MAGRPOTrainer(agent_model=model_dir, train_dataset=ITEMS, eval_dataset=None, reward_func=cooperative_reward,
                         formatters=FORMATTERS, args=args, trainer_kwargs=cpu_trainer_kwargs())


@pytest.mark.parametrize("temperature,top_p,extra", [(1.0, 1.0, {}), (0.7, 0.9, {}),
                                                    (1.0, 1.0, {"repetition_penalty": 1.3})])
def test_hf_engine_logprobs_are_the_models_logprobs_of_the_sampled_tokens(tiny_model_dir, temperature, top_p, extra):
    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    settings = SamplingSettings(max_new_tokens=10, temperature=temperature, top_p=top_p, top_k=None, extra=extra)
    s = sample_completions(model, tok, ["Topic: owls.", "A longer prompt: rivers and bread."], 3, settings,
                           SamplingStream(7))
    prompts = [p for p, row in zip(s.prompt_ids, s.completion_ids) for _ in row]
    comps = [c for row in s.completion_ids for c in row]
    batch = build_scoring_batch(prompts, comps, tok.pad_token_id, drop_last=False)
    with torch.no_grad():
        mine, _ = scored_token_logps(model.eval(), batch)
    engine = [lp for row in s.logprobs for lp in row]
    for r, c in enumerate(comps):
        assert len(engine[r]) == len(c)
        scored = mine[r][batch["score_mask"][r].bool()]
        # raw model log-probs (before temperature, top-p and the repetition penalty), as the trainer computes them
        torch.testing.assert_close(scored, torch.tensor(engine[r]), rtol=0, atol=1e-4)


def test_a_healthy_fit_logs_a_near_zero_gap(tiny_model_dir):
    tr = magrpo(tiny_model_dir)
    tr.train()
    for agent in (0, 1):
        gap = float(tr.trainer.callback_metrics[f"engine/agent_{agent}/logprob_gap"])
        assert 0 <= gap < 1e-4, gap  # measured 1e-7 (HF engine on the live weights)


class FrozenEngine(HFEngine):
    """Samples from a second copy of the initial agents that never receives the updates (a sync that never
    delivers), while counting the syncs like a healthy engine: only the log-prob gap can tell."""

    def __init__(self, model_dir):
        super().__init__(build_agents(model_dir, num_agents=2))


def test_an_engine_sampling_stale_weights_stops_the_run(tiny_model_dir):
    # lr 1e-2: one update moves the log-probs of the sampled tokens by ~0.16 nats (1e-3: ~0.05; measured)
    tr = magrpo(tiny_model_dir, agent_learning_rate=1e-2)
    tr.team.engine = FrozenEngine(tiny_model_dir)
    with pytest.raises(EngineSyncError, match=r"agent 0 at optimizer step 2: .* differ from the trainer's by "
                                              r"0\.\d+ nats per token .*logprob_gap_threshold='auto': 0\.005.* weight version 1"):
        tr.train()
    assert tr.module.optimizer_steps == 2  # the first update of each agent went through; the second was refused


def test_the_check_can_be_turned_off_and_the_gap_is_still_logged(tiny_model_dir):
    tr = magrpo(tiny_model_dir, logprob_gap_threshold=None, agent_learning_rate=1e-2)
    tr.team.engine = FrozenEngine(tiny_model_dir)
    tr.train()
    assert float(tr.trainer.callback_metrics["engine/agent_0/logprob_gap"]) > 0.01


class DroppedSyncEngine(HFEngine):
    """Told about every update, but the third sync of agent 1 is never applied to what it samples."""

    def __init__(self, team):
        super().__init__(team)
        self.told = [0] * team.num_agents

    def sync(self, agent_indices=None):
        for i in range(self.team.num_agents) if agent_indices is None else agent_indices:
            self.told[i] += 1
            if not (i == 1 and self.told[i] == 3):
                self.applied[i] += 1

    def weight_version(self, agent_index):
        return self.told[agent_index]


def test_a_sync_that_was_not_applied_stops_the_run_naming_both_versions(tiny_model_dir):
    tr = magrpo(tiny_model_dir)
    tr.team.engine = DroppedSyncEngine(tr.team)
    with pytest.raises(EngineSyncError, match=r"agent 1 at optimizer step \d+: the DroppedSyncEngine sampled with "
                                              r"weights of version 2 .* trainer's weights are at version 3"):
        tr.train()


@pytest.mark.parametrize("bad", [0, -0.1, float("nan"), "x"])
def test_bad_thresholds(bad):
    with pytest.raises(ValueError, match="logprob_gap_threshold must be \"auto\", a number > 0"):
        MAGRPOConfig(logprob_gap_threshold=bad)
    assert MAGRPOConfig(logprob_gap_threshold=" AUTO ").logprob_gap_threshold == "auto"


def test_auto_threshold_follows_the_precision():
    from comlrl_lightning.engines.verify import gap_threshold

    class Vllm:
        def __init__(self, kwargs):
            self.vllm_kwargs = kwargs

    model = torch.nn.Linear(2, 2)
    assert gap_threshold("auto", model, HFEngine.__new__(HFEngine)) == 0.005
    assert gap_threshold("auto", model, Vllm({"dtype": "bfloat16"})) == 0.1
    assert gap_threshold("auto", model.to(torch.bfloat16), Vllm({})) == 0.1
    assert gap_threshold(0.2, model, Vllm({})) == 0.2 and gap_threshold(None, model, Vllm({})) is None
    dropout = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1))
    assert gap_threshold("auto", dropout.train(), Vllm({})) is None  # training forward != the engine's
    assert gap_threshold("auto", dropout.eval(), Vllm({})) == 0.005


class FailingSyncEngine(HFEngine):
    def sync(self, agent_indices=None):
        if agent_indices == [1]:
            raise OSError("adapter folder vanished")
        super().sync(agent_indices)


def test_a_sync_that_raises_stops_the_run_naming_the_agent(tiny_model_dir):
    tr = magrpo(tiny_model_dir)
    tr.team.engine = FailingSyncEngine(tr.team)
    with pytest.raises(RuntimeError, match=r"FailingSyncEngine's weight sync of agent 1 failed before optimizer step "
                                           r"2 \(OSError: adapter folder vanished\)"):
        tr.train()


def iac(model_dir, **kw):
    from comlrl_lightning.config import IACConfig
    from comlrl_lightning.trainers.actor_critic import IACTrainer

    args = IACConfig(**{"num_train_epochs": 1, "max_new_tokens": 12, "temperature": 1.0, "top_p": 1.0, "top_k": None,
                        "agent_learning_rate": 1e-2, "critic_learning_rate": 1e-3, "eval_interval": 0,
                        "num_generations": 2, "rollout_buffer_size": 4, "train_batch_size": 2, "logging_steps": 1,
                        **kw})
    return IACTrainer(agent_model=model_dir, train_dataset=ITEMS, eval_dataset=None, reward_func=cooperative_reward,
                      formatters=FORMATTERS, args=args, trainer_kwargs=cpu_trainer_kwargs())


def test_iac_checks_the_engine_too(tiny_model_dir):
    healthy = iac(tiny_model_dir)
    healthy.train()
    assert 0 <= float(healthy.trainer.callback_metrics["engine/agent_1/logprob_gap"]) < 1e-4
    stale = iac(tiny_model_dir)
    stale.team.engine = FrozenEngine(tiny_model_dir)
    with pytest.raises(EngineSyncError, match=r"agent [01] at optimizer step \d+: .* weight version 1"):
        stale.train()
