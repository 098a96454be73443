"""collaboration_mode="centralized" (docs/coming-from-comlrl.md): one learner writes every role in one joint text;
prompts and rewards go through the adapter; the full joint completion is scored."""

from __future__ import annotations

import pytest
import torch
from conftest import cpu_trainer_kwargs

from comlrl_lightning.collaboration import CentralizedPrompt, CentralizedReward
from comlrl_lightning.comparators.centralized import TaggedCentralizedComparatorAdapter
from comlrl_lightning.config import MADPOConfig, MADPOIterConfig, MARLHFConfig, MARLHFIterConfig
from comlrl_lightning.trainers.preference import MADPOTrainer

ROLES = [lambda item: item["prompt"] + " Answer:", lambda item: item["prompt"] + " Elaboration:"]
ITEMS = [{"prompt": "Say hi."}, {"prompt": "Count."}, {"prompt": "Name a colour."}]


class HalvesAdapter:
    """Splits a joint text into two halves (the tiny model writes no tags)."""

    def build_prompt(self, item, prompts):
        return "Write both parts.\n" + "\n".join(prompts)

    def parse_completion(self, text, item, num_agents):
        cut = len(text) // 2
        return [text[:cut], text[cut:]]


def test_tagged_adapter_reward_parses_roles_and_unparsable_text_counts_as_empty():
    seen = []

    def reward(prompts, c1, c2, *, batch_items=None):
        seen.append((prompts, c1, c2, batch_items))
        return [float(len(c2[0]) - len(c1[0]))]

    adapter = TaggedCentralizedComparatorAdapter()
    fn = CentralizedReward(adapter, reward, ROLES)
    item = ITEMS[0]
    assert fn(["joint"], ["<agent_0>a</agent_0>\n<agent_1>bbb</agent_1>"], [item]) == [2.0]
    assert seen[-1] == (["Say hi. Answer:"], ["a"], ["bbb"], [item])
    assert fn(["joint"], ["no tags at all"], [item]) == [0.0]
    with pytest.raises(ValueError, match="require batch_items"):
        fn(["joint"], ["x"])
    prompt = CentralizedPrompt(adapter, ROLES)(item)
    assert "Agent 0 original prompt:\nSay hi. Answer:" in prompt and "<agent_1>" in prompt


def test_centralized_madpo_trains_one_learner_on_joint_texts(tiny_model_dir):
    calls = []

    def reward(c1, c2):
        calls.append((c1[0], c2[0]))
        return [float(len(c2[0]) > len(c1[0]))]

    args = MADPOConfig(collaboration_mode="centralized", num_agents=2, num_train_epochs=1, preference_num_candidates=4,
                       preference_pairs_per_sample=2, max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None,
                       eval_interval=0, eval_num_samples=1, train_batch_size=2)
    logged = []

    def eval_logger(agent_completions_turns, batch_items, prompts):
        logged.append(agent_completions_turns)
        return [{"roles": float(len(agent_completions_turns))}]

    tr = MADPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, eval_dataset=ITEMS[:1], reward_func=reward,
                      formatters=ROLES, args=args, centralized_comparator_adapter=HalvesAdapter(),
                      eval_logger=eval_logger, eval_aggregator=lambda m, num_turns: {"roles": m[0]["roles"]},
                      trainer_kwargs=cpu_trainer_kwargs())
    metrics = tr.train()
    assert tr.args.num_agents == 2 and tr.team.num_agents == 1  # R roles, one learner
    assert metrics["round/num_pairs"] > 0 and "train/loss" in metrics and "eval/reward_mean" in metrics
    pairs = tr.datamodule.pairs
    assert all(len(p.winner_completions) == 1 and p.prompts[0].startswith("Write both parts.") for p in pairs)
    assert tr.datamodule.score_last_token  # the full joint completion is scored (docs/decisions.md, decision 3)
    assert calls and all(isinstance(a, str) and isinstance(b, str) for a, b in calls)
    # eval_logger gets the joint texts split per role: [role][item][turn]
    assert metrics["eval/roles"] == 2.0 and logged and all(len(c) == 2 and len(c[0][0]) == 1 for c in logged)


def test_centralized_eval_logger_splits_joint_texts_per_role():
    from comlrl_lightning.collaboration import CentralizedEvalLogger

    seen = []
    split = CentralizedEvalLogger(CentralizedReward(TaggedCentralizedComparatorAdapter(), lambda a, b: [0.0], ROLES),
                                  lambda **kw: seen.append(kw) or [{}])
    joint = [["<agent_0>a</agent_0><agent_1>bbb</agent_1>", "untagged"], ["<agent_1>z</agent_1>"]]
    split(agent_completions_turns=[joint], batch_items=ITEMS[:2], prompts=["p0", "p1"])
    assert seen[0]["agent_completions_turns"] == [[["a", ""], [""]], [["bbb", ""], ["z"]]]
    assert seen[0]["batch_items"] == ITEMS[:2] and seen[0]["prompts"] == ["p0", "p1"]


def test_centralized_input_errors(tiny_model_dir):
    from comlrl_lightning.agents import load_model

    args = MADPOConfig(collaboration_mode="centralized", preference_num_candidates=2)
    m = load_model(tiny_model_dir)
    with pytest.raises(ValueError, match="exactly one actor model"):
        MADPOTrainer(agents=[m, m], tokenizer=None, train_dataset=ITEMS, reward_func=lambda a, b: [0.0], args=args)
    with pytest.raises(ValueError, match="collaboration_mode must be decentralized or centralized"):
        MADPOConfig(collaboration_mode="joint")


def test_iterative_configs_force_a_centralized_comparator():
    for cls in (MADPOIterConfig, MARLHFIterConfig):
        cfg = cls(collaboration_mode="centralized", num_agents=2, comparator_generation_mode="decentralized")
        assert cfg.comparator_generation_mode == "centralized"
    assert MARLHFConfig(collaboration_mode="centralized").collaboration_mode == "centralized"


def _joint_reward(calls):
    def reward(c1, c2):
        calls.append((c1[0], c2[0]))
        return [float(len(c2[0]) > len(c1[0]))]
    return reward


def test_centralized_madpo_iter_compares_joint_texts_and_replays_them(tiny_model_dir, tmp_path):
    import json

    from comlrl_lightning.trainers.preference import MADPOIterTrainer

    calls = []
    args = MADPOIterConfig(collaboration_mode="centralized", num_agents=2, num_iterations=2, num_train_epochs=1,
                           preference_num_candidates=2, preference_pairs_per_sample=2, max_new_tokens=6,
                           temperature=1.0, top_p=1.0, top_k=None, eval_interval=0, train_batch_size=2,
                           preference_replay_dir=str(tmp_path / "replay"))
    tr = MADPOIterTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS[:2], reward_func=_joint_reward(calls),
                          formatters=ROLES, args=args, centralized_comparator_adapter=HalvesAdapter(),
                          evaluation=False, trainer_kwargs=cpu_trainer_kwargs())
    assert tr.args.comparator_generation_mode == "centralized" and tr.team.num_agents == 1
    tr.train()
    assert calls and tr.datamodule.score_last_token
    pairs = tr.datamodule.new_pairs
    assert pairs and all(len(p.winner_completions) == 1 and len(p.loser_completions) == 1 for p in pairs)
    assert all(p.prompts[0].startswith("Write both parts.") for p in pairs)  # the comparator's prompt too
    files = sorted((tmp_path / "replay").glob("iteration_*.json"))
    assert files
    saved = json.loads(files[-1].read_text(encoding="utf-8"))["pairs"]  # the last round's raw joint texts
    assert [(r["winner_completions"], r["loser_completions"]) for r in saved] == \
        [(p.winner_completions, p.loser_completions) for p in pairs]


@pytest.mark.parametrize("iterative", [False, True])
def test_centralized_marlhf_reward_model_reads_joint_texts(tiny_model_dir, monkeypatch, iterative):
    from comlrl_lightning.callbacks import reward_model as learned_reward
    from comlrl_lightning.trainers.preference import MARLHFIterTrainer, MARLHFTrainer

    class Stub:
        def score(self, prompts_per_pair, completions_per_pair, batch_size=16):
            seen.append((prompts_per_pair, completions_per_pair))
            return [float(len(c[0])) for c in completions_per_pair]

    fits, seen = [], []

    def fake_fit(self, trainer, pl_module, pairs, seed):
        fits.append(list(pairs))
        self.fits += 1
        self.current = Stub()
        return self.current

    monkeypatch.setattr(learned_reward._RewardModelFitting, "fit", fake_fit)
    calls = []
    common = dict(collaboration_mode="centralized", num_agents=2, num_train_epochs=1, num_generations=2,
                  max_new_tokens=5, temperature=1.0, top_p=1.0, top_k=None, eval_interval=0, eval_num_samples=1,
                  preference_num_candidates=2, preference_pairs_per_sample=2, rollout_buffer_size=1,
                  agent_learning_rate=1e-2, logging_steps=1, seed=0)
    cls, cfg = (MARLHFIterTrainer, MARLHFIterConfig(num_iterations=2, **common)) if iterative else \
        (MARLHFTrainer, MARLHFConfig(**common))
    tr = cls(agent_model=tiny_model_dir, train_dataset=ITEMS[:2], reward_func=_joint_reward(calls), formatters=ROLES,
             args=cfg, centralized_comparator_adapter=HalvesAdapter(), evaluation=False,
             trainer_kwargs=cpu_trainer_kwargs())
    assert tr.args.num_agents == 2 and tr.team.num_agents == 1 and tr.learner_args.num_agents == 1
    before = [p.detach().clone() for p in tr.team.parameters_of(0)]
    tr.train()
    assert calls and fits and all(p.prompts[0].startswith("Write both parts.") for f in fits for p in f)
    assert all(len(p.winner_completions) == 1 for f in fits for p in f)  # the raw joint text, unparsed
    assert seen and all(len(c) == 1 and p[0].startswith("Write both parts.")  # one joint text per response
                        for prompts, cs in seen for p, c in zip(prompts, cs))
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.team.parameters_of(0)))  # the one learner learnt


def test_wandb_run_config_names_roles_and_actor_models(tmp_path):
    from comlrl_lightning.trainers.common import wandb_logger

    args = MADPOIterConfig(collaboration_mode="centralized", num_agents=3)
    config = wandb_logger({"project": "p", "dir": str(tmp_path)}, args, "MADPOIter")._wandb_init["config"]
    assert (config["num_roles"], config["num_actor_models"]) == (3, 1)
    assert config["collaboration_mode"] == "centralized" and config["comparator_generation_mode"] == "centralized"
