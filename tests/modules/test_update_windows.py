"""Rollouts batched across the update window (docs/multiturn.md §2.11): the window arithmetic by hand, exact on-policy
by default (each item is sampled by the weights that sample it with one item per step), one ``generate`` per agent
per level per window, staleness reported when ``generation_batch_size`` goes beyond the window, and bad values."""

from __future__ import annotations

import io

import pytest
import torch
from conftest import cpu_trainer_kwargs
from test_rollout_batching import count_generate

from comlrl_lightning.config import IACConfig, MAGRPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.multiturn.transitions import plain_transition
from comlrl_lightning.multiturn.tree import max_nodes_per_tree, rollout_window, update_windows
from comlrl_lightning.trainers.actor_critic import IACTrainer
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music", "owls", "maps")]
SMALL = {"num_train_epochs": 1, "max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0, "top_k": None,
         "agent_learning_rate": 1e-3, "eval_interval": 0, "eval_num_samples": 1, "logging_steps": 1}



# --- the arithmetic ------------------------------------------------------------------------------------------

def test_max_nodes_per_tree_by_hand():
    assert max_nodes_per_tree(2, 2, 1, "aligned") == 1
    assert max_nodes_per_tree(2, 2, 2, "aligned") == 1 + 2
    assert max_nodes_per_tree(2, 2, 2, "cross") == 1 + 4
    assert max_nodes_per_tree(2, 3, 3, "aligned") == 1 + 3 + 9
    assert max_nodes_per_tree(1, 4, 2, "cross") == 1 + 4  # one agent: cross is aligned


def test_rollout_window_by_hand():
    # one sample per item, buffer of 4, empty buffers: items 1-3 can never fill it, item 4 does
    assert rollout_window([0, 0], 4, 1, 100) == 4
    assert rollout_window([0, 0], 4, 1, 3) == 3  # fewer items left than the window
    assert rollout_window([2, 0], 4, 1, 100) == 2  # agent 0 holds 2: the 2nd item may fill it
    assert rollout_window([0], 4, 3, 100) == 2  # 3 per item: 0 + 3 < 4, then 6 >= 4
    assert rollout_window([2], 4, 3, 100) == 1  # 2 + 3 >= 4: the first item may already trigger
    assert rollout_window([0], 1, 1, 100) == 1  # a buffer of 1 updates after every item
    assert rollout_window([0], 4, 1, 0) == 0


def test_update_windows_follow_the_buffers():
    buffered = [0]
    windows = []
    for window in update_windows(list(range(7)), lambda: buffered, 3, 1):
        windows.append(window)
        buffered[0] = (buffered[0] + len(window)) % 3  # each item adds one sample; a full buffer is drained
    assert windows == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(update_windows(list(range(7)), lambda: [0], 3, 1, whole=True)) == [list(range(7))]


# --- training ------------------------------------------------------------------------------------------------

def record_versions(module, method: str) -> dict:
    """Wrap ``module.<method>`` (rollout_batch / collect_batch); returns {item index: the agents' policy versions
    when it was rolled out}."""
    seen: dict = {}
    original = getattr(module, method)

    def wrapped(entries, *args, **kw):
        for index, _ in entries:
            assert index not in seen, "an item was rolled out twice"
            seen[index] = tuple(module.policy_versions)
        out = original(entries, *args, **kw)
        if method == "rollout_batch":  # the trees' sizes, under the key "sizes"
            seen.setdefault("sizes", []).extend(len(samples) // module.team.num_agents for _, samples in out)
        return out

    setattr(module, method, wrapped)
    return seen


def magrpo(model_dir, items, **kw):
    args = MAGRPOConfig(**{**SMALL, "num_generations": 2, **kw})
    return MAGRPOTrainer(agent_model=model_dir, train_dataset=items, eval_dataset=None,
                         reward_func=cooperative_reward, formatters=FORMATTERS, args=args,
                         external_transition=plain_transition if kw.get("num_turns", 1) > 1 else None,
                         trainer_kwargs=cpu_trainer_kwargs())


@pytest.mark.parametrize("kw", [
    {"rollout_buffer_size": 2},  # one node per item: windows of 2 items
    {"rollout_buffer_size": 3, "train_batch_size": 2},  # 6 items: windows of 3
    {"num_turns": 2, "rollout_buffer_size": 4, "train_batch_size": 2},  # 3 nodes per tree, drains inside trees
    # uneven trees: roots above the threshold have no children, so trees give 1 or 3 samples
    {"num_turns": 2, "rollout_buffer_size": 4, "train_batch_size": 2, "early_termination_threshold": 1.0},
], ids=["1turn-R2", "1turn-R3", "2turn-R4", "2turn-R4-early"])
def test_magrpo_windows_are_exactly_on_policy(tiny_model_dir, kw):
    runs = {}
    for batch in (1, None):
        tr = magrpo(tiny_model_dir, ITEMS, generation_batch_size=batch, **kw)
        runs[batch] = record_versions(tr.module, "rollout_batch")
        calls = count_generate(tr.team)
        tr.train()
        if batch is None:
            windows = calls
    sizes = {batch: run.pop("sizes") for batch, run in runs.items()}
    if "early_termination_threshold" in kw:
        assert set(sizes[None]) == {1, 3}, sizes  # really uneven trees
    assert runs[None] == runs[1] and sorted(runs[1]) == list(range(len(ITEMS)))
    assert len({v for v in runs[1].values()}) > 1, "the job must update between items for the test to mean anything"
    # one generate per agent per tree level per window: windows hold several items
    turns = kw.get("num_turns", 1)
    assert len(windows[0]) < len(ITEMS) * turns and len(windows[0]) % turns == 0


def test_magrpo_one_call_per_agent_per_window(tiny_model_dir):
    tr = magrpo(tiny_model_dir, ITEMS, rollout_buffer_size=3)
    calls = count_generate(tr.team)
    tr.train()
    assert calls == [[3, 3]] * 2  # per agent 2 windows of 3 prompts (K=2 completions each)
    assert tr.trainer.global_step > 0


def test_iac_windows_are_exactly_on_policy(tiny_model_dir):
    runs = {}
    for batch in (1, None):
        args = IACConfig(**{**SMALL, "num_generations": 2, "rollout_buffer_size": 4, "train_batch_size": 2,
                            "critic_learning_rate": 1e-3, "generation_batch_size": batch})
        tr = IACTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, eval_dataset=None,
                        reward_func=cooperative_reward, formatters=FORMATTERS, args=args,
                        trainer_kwargs=cpu_trainer_kwargs())
        runs[batch] = record_versions(tr.module, "collect_batch")
        calls = count_generate(tr.team)
        tr.train()
        if batch is None:
            assert calls == [[2] * 3] * 2  # K=2 samples per item, buffer 4: 3 windows of 2 prompts
    assert runs[None] == runs[1] and len(set(runs[1].values())) == 3


def test_a_fixed_generation_batch_size_beyond_the_window_reports_staleness(tiny_model_dir):
    tr = magrpo(tiny_model_dir, ITEMS, rollout_buffer_size=2, generation_batch_size=6)
    seen = record_versions(tr.module, "rollout_batch")
    calls = count_generate(tr.team)
    tr.train()
    seen.pop("sizes")
    assert set(seen.values()) == {(0, 0)}  # all six items sampled by the initial weights
    assert calls == [[6], [6]]
    # the last update (items 4 and 5) trains each agent's third version on samples of its first
    assert float(tr.trainer.callback_metrics["train/agent0/staleness"]) == 2.0
    exact = magrpo(tiny_model_dir, ITEMS, rollout_buffer_size=2)
    exact.train()
    assert float(exact.trainer.callback_metrics["train/agent0/staleness"]) == 0.0


def test_bad_generation_batch_size(tiny_model_dir):
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="generation_batch_size must be null .* Got"):
            MAGRPOConfig(generation_batch_size=bad)
        with pytest.raises(ValueError, match="generation_batch_size must be null"):
            IACConfig(generation_batch_size=bad)
    tr = magrpo(tiny_model_dir, ITEMS[:2], generation_batch_size=5)
    with pytest.raises(ValueError, match=r"generation_batch_size=5 is larger than the train dataset \(2 items\)"):
        tr.train()


def test_buffered_samples_survive_a_checkpoint(tiny_model_dir):
    """A checkpoint inside an epoch (a window may leave samples waiting for the next update) keeps the buffers and
    their policy versions."""
    tr = magrpo(tiny_model_dir, ITEMS, num_turns=2, rollout_buffer_size=4)
    m, dm = tr.module, tr.datamodule
    (_, samples), = m.rollout_batch([(0, ITEMS[0])], dm.formatters, dm.oracle, dm.external_transition)
    for s in samples:
        s.version = 3
        m.rollout_buffers[s.agent].append(s)
    m.policy_versions = [3, 3]
    progress, rank = m.progress_state(), m.rank_state()  # what on_save_checkpoint stores
    buf = io.BytesIO()
    torch.save({"progress": progress, "rank": rank}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)  # plain types only
    fresh = magrpo(tiny_model_dir, ITEMS, num_turns=2, rollout_buffer_size=4).module
    fresh.load_progress_state(loaded["progress"])
    fresh.load_rank_state(loaded["rank"])
    assert fresh.rollout_buffers == m.rollout_buffers and fresh.policy_versions == [3, 3] and len(fresh.rollout_buffers[0]) == 3
