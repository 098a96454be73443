"""Level-batched rollouts: one ``generate`` call per agent per tree level, covering every node of the level
and every item of the batch (docs/multiturn.md §2.2), for MAGRPO training and evaluation, actor-critic
episodes (docs/multiturn.md §4.3) and single-turn evaluation and preference collection (one call per agent per chunk)."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
from conftest import cpu_trainer_kwargs

from comlrl_lightning.config.magrpo import MAGRPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.generation import SamplingSettings, SamplingStream
from comlrl_lightning.multiturn.transitions import plain_transition
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

ROLLOUTS_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "rollouts.py"
ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]


def small_args(**kw):
    base = {"num_train_epochs": 1, "num_generations": 2, "max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0,
            "top_k": None, "agent_learning_rate": 1e-3, "eval_interval": 0, "eval_num_samples": 1,
            "logging_steps": 1, "rollout_buffer_size": 100}
    base.update(kw)
    return MAGRPOConfig(**base)


def count_generate(team, per_prompt: int = 2) -> list[list[int]]:
    """Wrap every agent model's ``generate``; returns per agent the number of prompts of each call (rows times
    ``num_return_sequences`` over ``per_prompt``, the completions per prompt: the engine hands ``generate`` each
    prompt row repeated once per completion)."""
    calls: list[list[int]] = [[] for _ in range(team.num_agents)]
    for a, model in enumerate(team.models):
        assert team.models.count(model) == 1, "the test needs one model object per agent"
        original = model.generate

        def wrapped(*args, _a=a, _orig=original, **kw):
            rows = int(kw["input_ids"].shape[0]) * kw.get("num_return_sequences", 1)
            assert rows % per_prompt == 0, (rows, per_prompt)
            calls[_a].append(rows // per_prompt)
            return _orig(*args, **kw)

        model.generate = wrapped
    return calls


def make_trainer(model_dir, items, **kw):
    return MAGRPOTrainer(agent_model=model_dir, train_dataset=items, eval_dataset=None,
                         reward_func=cooperative_reward, formatters=FORMATTERS, args=small_args(**kw),
                         external_transition=plain_transition if kw.get("num_turns", 1) > 1 else None,
                         trainer_kwargs=cpu_trainer_kwargs())


@pytest.mark.parametrize("mode,turns", [("aligned", 2), ("cross", 2), ("aligned", 1)])
def test_training_step_makes_one_generate_call_per_agent_per_level(tiny_model_dir, mode, turns):
    tr = make_trainer(tiny_model_dir, ITEMS[:2], num_turns=turns, joint_mode=mode)
    calls = count_generate(tr.team)
    tr.train()
    k = 2
    b = k if mode == "aligned" else k ** 2
    # the buffer (100) never fills: both items are one update window, rolled out together; per agent one call per
    # level covering the B^t nodes of both trees
    for a in range(2):
        assert calls[a] == [2 * b ** t for t in range(turns)]
    assert tr.module.env_step == 2 * sum(b ** (t + 1) for t in range(turns))


@pytest.mark.parametrize("mode,turns", [("aligned", 2), ("aligned", 1)])
def test_generation_batch_size_one_rolls_out_item_by_item(tiny_model_dir, mode, turns):
    tr = make_trainer(tiny_model_dir, ITEMS[:2], num_turns=turns, joint_mode=mode, generation_batch_size=1)
    calls = count_generate(tr.team)
    tr.train()
    # 2 training steps (one item each); per step and agent: one call per level covering its B^t nodes
    for a in range(2):
        assert calls[a] == [2 ** t for t in range(turns)] * 2


@pytest.mark.parametrize("mode", ["aligned", "cross"])
def test_a_batch_of_items_shares_each_level_call(tiny_model_dir, mode):
    tr = make_trainer(tiny_model_dir, ITEMS[:2], num_turns=2, joint_mode=mode, reference_kl_enabled=True)
    m, dm = tr.module, tr.datamodule
    calls = count_generate(tr.team)
    trees = m.rollout_batch(list(enumerate(ITEMS[:2])), dm.formatters, dm.oracle, dm.external_transition)
    k, b = 2, (2 if mode == "aligned" else 4)
    for a in range(2):
        assert calls[a] == [2, 2 * b]  # level 0: both roots; level 1: every child of both trees
    assert len(trees) == 2
    for root, samples in trees:
        assert len(list(root.walk())) == 1 + b
        assert len(samples) == 2 * (1 + b) and all(s.kls is not None and len(s.kls) == k for s in samples)
    # env_step numbering: item after item, pre-order within each tree
    steps = [nd.env_step for root, _ in trees for nd in root.walk()]
    assert steps == [b * (i + 1) for i in range(len(steps))] and m.env_step == steps[-1]


def test_the_benchmarks_per_node_sampling_is_the_unbatched_loop(tiny_model_dir):
    spec = importlib.util.spec_from_file_location("rollouts_bench", ROLLOUTS_BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tr = make_trainer(tiny_model_dir, ITEMS[:1], num_turns=2, joint_mode="aligned")
    m, dm = tr.module, tr.datamodule
    bench.sample_per_node(m)
    calls = count_generate(tr.team)
    m.rollout_batch([(0, ITEMS[0])], dm.formatters, dm.oracle, dm.external_transition)
    assert calls == [[1] * 3, [1] * 3]  # 3 nodes, one call each


def test_rollouts_are_reproducible_for_a_fixed_seed(tiny_model_dir):
    texts = []
    for _ in range(2):
        tr = make_trainer(tiny_model_dir, ITEMS[:2], num_turns=2, joint_mode="aligned", max_new_tokens=6)
        dm = tr.datamodule
        trees = tr.module.rollout_batch(list(enumerate(ITEMS[:2])), dm.formatters, dm.oracle, dm.external_transition)
        texts.append([d.texts for root, _ in trees for nd in root.walk() for d in nd.draws])
    assert texts[0] == texts[1]


def test_multiturn_evaluation_samples_every_path_of_a_turn_at_once(tiny_model_dir):
    tr = make_trainer(tiny_model_dir, ITEMS, num_turns=2)
    dm = tr.datamodule
    calls = count_generate(tr.team, per_prompt=1)  # every evaluated path is a prompt of its own
    out = tr.module.evaluate_turns(ITEMS[:3], dm.formatters, dm.oracle, plain_transition, samples_per_item=2)
    assert calls == [[6, 6], [6, 6]]  # per agent one call per turn, 3 items x 2 samples
    assert set(out) == {"eval/turn_1/reward_mean", "eval/turn_1/expected_return", "eval/turn_2/reward_mean",
                        "eval/turn_2/expected_return"}


def test_single_turn_evaluation_and_preference_collection_make_one_call_per_agent_per_chunk(tiny_model_dir):
    from comlrl_lightning.evaluation import evaluate_team
    from comlrl_lightning.preferences import collect_offline_pairs

    tr = make_trainer(tiny_model_dir, ITEMS)
    dm, settings = tr.datamodule, SamplingSettings(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None)
    calls = count_generate(tr.team)
    evaluate_team(tr.team, ITEMS, dm.formatters, dm.oracle, settings, 5, num_samples=2)
    assert calls == [[4], [4]]
    calls[0].clear()
    calls[1].clear()
    collect_offline_pairs(tr.team, ITEMS, dm.formatters, dm.oracle, settings, 2, "reward_gap", None, random.Random(0),
                          [SamplingStream(1), SamplingStream(2)], chunk_size=3, progress=False)
    assert calls == [[3, 1], [3, 1]]


@pytest.mark.parametrize("maac", [False, True])
def test_actor_critic_episodes_of_a_batch_share_each_turn_call(tiny_model_dir, maac):
    from comlrl_lightning.config.actor_critic import IACConfig, MAACConfig
    from comlrl_lightning.modules.actor_critic import ActorCriticModule
    from comlrl_lightning.rewards import RewardOracle

    small = {"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0, "num_turns": 2, "eval_interval": 0}
    args = MAACConfig(**small) if maac else IACConfig(use_separate_critic=False, **small)
    m = ActorCriticModule(agent_model=tiny_model_dir, args=args)
    m.bind_task(FORMATTERS, RewardOracle(cooperative_reward), plain_transition)
    calls = count_generate(m.team, per_prompt=1)  # num_generations=1: one episode per item
    episodes = m.collect_batch(list(enumerate(ITEMS[:3])))
    assert calls == [[3, 3], [3, 3]]  # per agent one call per turn covering the 3 episodes
    assert [len(e) for e in episodes] == [2 * 2] * 3
    assert [{s.item for s in e} for e in episodes] == [{0}, {1}, {2}]
    for c in calls:
        c.clear()
    out = m.evaluate_turns(ITEMS)
    assert calls == [[4, 4], [4, 4]] and "eval/turn_2/reward_mean" in out
