"""Bounded user code (issue 31, item 7): ``reward_timeout`` and ``transition_timeout`` on the TaskDataModule.

A reward or transition that blocks forever used to hang the run; with the option, the call past the deadline is an
error naming the item and the function, whichever caller (RewardOracle.score, the actor-critic episodes, the
transition call of the rollout tree) made it. Blocking calls wait on an Event the test sets afterwards, so no
thread outlives the test.
"""

from __future__ import annotations

import inspect
import threading

import lightning as L
import pytest
import torch
from conftest import cpu_trainer_kwargs

from comlrl_lightning.data.task import TaskDataModule
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.multiturn.transitions import TransitionError, bound_transition, call_transition, plain_transition
from comlrl_lightning.rewards import BoundedCall, RewardError, RewardOracle, set_reward_range

ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains")]


@pytest.fixture
def release():
    event = threading.Event()
    yield event
    event.set()  # every blocked call returns: its daemon thread ends


def test_a_reward_past_its_timeout_names_the_item_and_the_function(release):
    def stuck_reward(completions_a, completions_b):
        release.wait(60)
        return [1.0]

    oracle = RewardOracle(stuck_reward, timeout=0.2)
    with pytest.raises(RewardError) as info:
        oracle.score(["p"], ["a", "b"], {"prompt": "p"}, 7)
    text = str(info.value)
    assert "task item 7" in text and "stuck_reward" in text and "reward_timeout=0.2" in text, text
    stuck = [t for t in threading.enumerate() if t.name.startswith("reward_timeout:")]
    assert stuck and all(t.daemon for t in stuck)  # left running, never holding the process up at exit
    assert RewardOracle(stuck_reward).reward_func is stuck_reward  # no option: called directly, as before


def test_a_bounded_reward_is_dispatched_and_checked_as_before():
    calls = []

    def reward(prompts, completions_a, completions_b, *, batch_items=None):  # P == N + 1: prompts first
        calls.append((prompts, completions_a, completions_b, batch_items, torch.is_grad_enabled()))
        return [len(completions_a[0]) + len(completions_b[0])]

    set_reward_range(reward, 0, 10)
    oracle = RewardOracle(reward, reward_processor=lambda x: x / 10, timeout=5)
    assert isinstance(oracle.reward_func, BoundedCall)
    assert inspect.signature(oracle.reward_func) == inspect.signature(reward)
    assert oracle.reward_func.reward_range == (0.0, 10.0)
    with torch.no_grad():
        assert oracle.score(["p"], ["ab", "c"], {"prompt": "p", "k": 1}, 0) == (0.3, 3.0)
    assert calls == [(["p"], ["ab"], ["c"], [{"prompt": "p", "k": 1}], False)]  # the caller's grad mode

    def broken(completions_a, completions_b):
        raise KeyError("missing field")

    with pytest.raises(RewardError, match="task item 2: KeyError: 'missing field'"):
        RewardOracle(broken, timeout=5).score(["p"], ["a", "b"], {}, 2)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "10", True])
def test_timeout_options_are_checked(bad):
    for option in ("reward_timeout", "transition_timeout"):
        with pytest.raises(ValueError, match=f"{option} must be a positive number of seconds or None"):
            TaskDataModule(train_dataset=ITEMS, eval_dataset=None, **{option: bad})


def test_a_transition_past_its_timeout_names_turn_branch_item_and_function(release):
    def stuck_transition(prompt, agent_completions, num_agents):
        release.wait(60)
        return ["x"] * num_agents

    bounded = bound_transition(stuck_transition, 0.2)
    with pytest.raises(TransitionError) as info:
        call_transition(bounded, "Topic: rivers.", ["a", "b"], 2, [["p"], ["p"]], [["a"], ["b"]], turn=0,
                        branch=(1, 0))
    text = str(info.value)
    for part in ("turn 1", "branch (1, 0)", "stuck_transition", "transition_timeout=0.2", "'Topic: rivers.'"):
        assert part in text, (part, text)
    assert bound_transition(stuck_transition, None) is stuck_transition


def test_the_data_module_bounds_both_and_a_fit_stops_on_a_stuck_reward(tiny_model_dir, release):
    from comlrl_lightning.config.magrpo import MAGRPOConfig
    from comlrl_lightning.modules.magrpo import MAGRPOModule

    seen = []

    def transition(prompt, agent_completions, num_agents, response_history_per_agent=None):
        seen.append(response_history_per_agent)
        return plain_transition(prompt, agent_completions, num_agents, None, response_history_per_agent)

    dm = TaskDataModule(train_dataset=ITEMS, eval_dataset=None, reward_func=cooperative_reward, formatters=FORMATTERS,
                        external_transition=transition, reward_timeout=30, transition_timeout=30)
    assert isinstance(dm.oracle.reward_func, BoundedCall) and isinstance(dm.external_transition, BoundedCall)
    out = call_transition(dm.external_transition, "Topic: a.", ["x", "y"], 2, [["p"], ["q"]], [["x"], ["y"]],
                          turn=0, branch=0)
    assert len(out) == 2 and seen == [[["x"], ["y"]]]  # the declared history still reaches it

    calls = []

    def reward_stuck_on_second_item(completions_a, completions_b):
        calls.append(1)
        if len(calls) > 2:  # the first item's two generations score; the next call blocks (for a minute: without
            release.wait(60)  # the bound the fit would end and the test fail instead of hanging)
        return [1.0]

    dm = TaskDataModule(train_dataset=ITEMS, eval_dataset=None, reward_func=reward_stuck_on_second_item,
                        formatters=FORMATTERS, reward_timeout=1.0)
    args = MAGRPOConfig(num_train_epochs=1, num_generations=2, max_new_tokens=4, eval_interval=0,
                        rollout_buffer_size=1, logging_steps=1)
    module = MAGRPOModule(agent_model=tiny_model_dir, args=args)
    trainer = L.Trainer(**cpu_trainer_kwargs(max_epochs=1))
    with pytest.raises(RewardError) as info:
        trainer.fit(module, datamodule=dm)
    assert "reward_stuck_on_second_item" in str(info.value) and "reward_timeout=1" in str(info.value)
    assert "item 1" in str(info.value), str(info.value)
