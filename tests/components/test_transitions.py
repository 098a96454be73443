"""External transitions: the five-argument call, result validation, prompt resolution (docs/multiturn.md §5, §7.3)."""

from __future__ import annotations

import functools

import pytest

from comlrl_lightning.multiturn.transitions import (
    TransitionError,
    call_transition,
    check_transition_signature,
    next_prompts,
    plain_transition,
)

HIST_P = [["p0"], ["p1"]]
HIST_R = [["a"], ["b"]]


def call(fn, **kw):
    return call_transition(fn, "task", ["a", "b"], 2, HIST_P, HIST_R, turn=kw.pop("turn", 0),
                           branch=kw.pop("branch", [(1, 1)]))


def test_called_with_exactly_the_five_arguments_by_keyword():
    seen = {}

    def only_kwargs(**kwargs):
        seen.update(kwargs)
        return ["x", "y"]

    assert call(only_kwargs) == ["x", "y"]
    assert sorted(seen) == sorted(["prompt", "agent_completions", "num_agents", "prompt_history_per_agent",
                                   "response_history_per_agent"])
    assert seen["prompt"] == "task" and seen["agent_completions"] == ["a", "b"] and seen["num_agents"] == 2
    assert seen["prompt_history_per_agent"] == HIST_P and seen["response_history_per_agent"] == HIST_R


def test_other_names_get_the_first_three_positionally_and_partial_works():
    def renamed(p, comps, n, prompt_history_per_agent=None, response_history_per_agent=None):
        return [f"{p}:{c}:{n}:{len(response_history_per_agent[i])}" for i, c in enumerate(comps)]

    assert call(renamed) == ["task:a:2:1", "task:b:2:1"]

    def with_mode(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent,
                  mode):
        return [mode] * num_agents

    assert call(functools.partial(with_mode, mode="plain")) == ["plain", "plain"]


def test_the_histories_are_optional():
    def three(prompt, agent_completions, num_agents):  # the seed calls the two histories optional
        return [f"{prompt}|{c}" for c in agent_completions]

    def renamed_three(p, comps, n):
        return [p] * n

    def one_history(prompt, agent_completions, num_agents, response_history_per_agent):
        return [str(len(h)) for h in response_history_per_agent]

    def renamed_with_kwargs(p, comps, n, **kwargs):
        return [",".join(sorted(kwargs))] * n

    for fn in (three, renamed_three, one_history, renamed_with_kwargs):
        check_transition_signature(fn)  # accepted at construction
    assert call(three) == ["task|a", "task|b"]
    assert call(renamed_three) == ["task", "task"]
    assert call(one_history) == ["1", "1"]
    assert call(renamed_with_kwargs) == ["prompt_history_per_agent,response_history_per_agent"] * 2


@pytest.mark.parametrize("fn, fragment", [
    (lambda prompt: [prompt], "<lambda>(prompt) cannot be called as a transition (too many positional arguments)"),
    (lambda a, b, c, mode: [a], "missing a required argument: 'mode'"),
    (lambda prompt, agent_completions, *, turn_index: [prompt], "(too many positional arguments)"),
])
def test_a_signature_that_cannot_take_the_arguments_is_refused(fn, fragment):
    with pytest.raises(ValueError, match="external_transition ") as exc:
        check_transition_signature(fn)
    assert fragment in str(exc.value) and "functools.partial" in str(exc.value)
    with pytest.raises(ValueError, match="must be a callable; got int"):
        check_transition_signature(3)


def test_facades_refuse_a_bad_transition_at_construction():
    from comlrl_lightning.config import IACConfig, MAGRPOConfig
    from comlrl_lightning.trainers.actor_critic import IACTrainer
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    def bad(prompt, agent_completions, num_agents, mode):
        return [prompt] * num_agents

    common = {"agent_model": "embedded:tiny", "train_dataset": [{"prompt": "p"}], "reward_func": lambda a, b: [0.0]}
    with pytest.raises(ValueError, match=r"external_transition .*bad\(prompt, agent_completions, num_agents, mode\)"):
        MAGRPOTrainer(**common, external_transition=bad, args=MAGRPOConfig(num_turns=2))
    with pytest.raises(ValueError, match="missing a required argument: 'mode'"):
        IACTrainer(**common, external_transition=bad, args=IACConfig(num_turns=2))


@pytest.mark.parametrize("result,fragment", [
    (["only one"], "returned 1 values but expected 2"),
    (["a", "b", "c"], "returned 3 values but expected 2"),
    ("a string", "list or tuple"),
    (None, "list or tuple"),
    (["ok", 3], "element 1 is int"),
    ([None, "ok"], "element 0 is NoneType"),
])
def test_bad_results_name_turn_and_branch(result, fragment):
    with pytest.raises(TransitionError) as info:
        call(lambda **kw: result, turn=1, branch=[(0, 1), (1, 0)])
    msg = str(info.value)
    assert fragment in msg
    assert "turn 2" in msg and "branch [(0, 1), (1, 0)]" in msg
    assert "per-agent prompts" in msg


def test_exception_inside_the_transition_is_wrapped():
    def boom(**kw):
        raise KeyError("entry_point")

    with pytest.raises(TransitionError, match=r"failed at turn 1 .*branch \[\(1, 1\)\].*KeyError"):
        call(boom)


def test_tuple_result_is_accepted_and_returned_as_list():
    assert call(lambda **kw: ("x", "y")) == ["x", "y"]


def test_plain_transition_contains_task_history_and_instruction():
    out = plain_transition("Topic: owls.", ["short", "long text"], 2, [["f0"], ["f1"]], [["short"], ["long text"]])
    assert len(out) == 2
    assert out[0].startswith("Topic: owls.") and "Turn 1: short" in out[0] and "Agent 2: long text" in out[0]
    assert "Turn 1: long text" in out[1] and "Agent 1: short" in out[1]
    assert out[0].rstrip().endswith("Revise your response.")
    assert call(plain_transition) == plain_transition("task", ["a", "b"], 2, HIST_P, HIST_R)


def test_next_prompts_formatter_and_passthrough():
    item = {"prompt": "original", "id": 3}
    formatters = [lambda it: f"A: {it['prompt']} ({it['id']})",
                  lambda it, external_prompts=None: f"B: {it['prompt']} / {external_prompts}"]
    assert next_prompts(["e0", "e1"], item, formatters, passthrough=False) == ["A: e0 (3)", "B: e1 / e1"]
    assert item["prompt"] == "original"  # the item itself is not modified
    assert next_prompts(["e0", "e1"], item, formatters, passthrough=True) == ["e0", "e1"]
    with pytest.raises(ValueError, match="agent 0.*external_prompt_passthrough"):
        next_prompts(["e0", "e1"], item, [lambda it: it["missing"], formatters[1]], passthrough=False)
