"""collaboration_mode="centralized" (docs/coming-from-comlrl.md): one learner writes every role in one joint text;
prompts and rewards go through the adapter; the full joint completion is scored."""

from __future__ import annotations

import pytest
from conftest import cpu_trainer_kwargs

from comlrl_lightning.collaboration import CentralizedPrompt, CentralizedReward
from comlrl_lightning.comparators.centralized import TaggedCentralizedComparatorAdapter
from comlrl_lightning.config import MADPOConfig, MADPOIterConfig, MARLHFConfig
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
    tr = MADPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, eval_dataset=ITEMS[:1], reward_func=reward,
                      formatters=ROLES, args=args, centralized_comparator_adapter=HalvesAdapter(),
                      trainer_kwargs=cpu_trainer_kwargs())
    metrics = tr.train()
    assert tr.args.num_agents == 2 and tr.team.num_agents == 1  # R roles, one learner
    assert metrics["round/num_pairs"] > 0 and "train/loss" in metrics and "eval/reward_mean" in metrics
    pairs = tr.datamodule.pairs
    assert all(len(p.winner_completions) == 1 and p.prompts[0].startswith("Write both parts.") for p in pairs)
    assert tr.datamodule.score_last_token  # the full joint completion is scored (docs/decisions.md, decision 3)
    assert calls and all(isinstance(a, str) and isinstance(b, str) for a, b in calls)


def test_centralized_input_errors(tiny_model_dir):
    from comlrl_lightning.agents import load_model

    args = MADPOConfig(collaboration_mode="centralized", preference_num_candidates=2)
    m = load_model(tiny_model_dir)
    with pytest.raises(ValueError, match="exactly one actor model"):
        MADPOTrainer(agents=[m, m], tokenizer=None, train_dataset=ITEMS, reward_func=lambda a, b: [0.0], args=args)
    for cls in (MADPOIterConfig, MARLHFConfig):
        with pytest.raises(ValueError, match="supported by MADPO only"):
            cls(collaboration_mode="centralized")
