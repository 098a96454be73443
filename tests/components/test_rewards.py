"""Reward dispatch (docs/multiturn.md §6.1), coercion, the oracle's checks, and the processors."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import pytest
import torch

from comlrl_lightning.rewards import (
    RewardError,
    RewardOracle,
    RewardProcessors,
    call_reward_function,
    set_reward_range,
)

PROMPTS = ["p0", "p1"]
C1, C2, C3 = ["a1", "a2"], ["b1", "b2"], ["c1", "c2"]
ITEMS = [{"id": 0}, {"id": 1}]


class Recorder:
    def __init__(self):
        self.calls: list[tuple[tuple, dict]] = []

    def add(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return [1.0] * len(args[-1]) if args and isinstance(args[-1], list) else [1.0, 1.0]


# --- docs/multiturn.md §6.1 dispatch ----------------------------------------------------------------------------------

def test_var_args_get_one_list_per_agent():
    rec = Recorder()

    def f(*args):
        return rec.add(*args)

    call_reward_function(f, PROMPTS, [C1, C2, C3], ITEMS)
    assert rec.calls == [((C1, C2, C3), {})]


def test_single_agent_one_positional():
    rec = Recorder()

    def f(completions):
        return rec.add(completions)

    call_reward_function(f, PROMPTS, [C1])
    assert rec.calls == [((C1,), {})]


def test_single_agent_two_positionals_get_prompts_first():
    rec = Recorder()

    def f(prompts, completions):
        return rec.add(prompts, completions)

    call_reward_function(f, PROMPTS, [C1])
    assert rec.calls == [((PROMPTS, C1), {})]


def test_n_positionals_get_the_lists():
    rec = Recorder()

    def f(x, y):
        return rec.add(x, y)

    call_reward_function(f, PROMPTS, [C1, C2], ITEMS)
    assert rec.calls == [((C1, C2), {})]


def test_n_plus_one_positionals_get_prompts_positionally():
    rec = Recorder()

    def f(prompts, x, y, **kwargs):
        return rec.add(prompts, x, y, **kwargs)

    call_reward_function(f, PROMPTS, [C1, C2], ITEMS)
    # prompts went positionally, so only batch_items comes as a keyword.
    assert rec.calls == [((PROMPTS, C1, C2), {"batch_items": ITEMS})]


def test_one_positional_with_several_agents_gets_a_list_of_lists():
    rec = Recorder()

    def f(all_completions):
        rec.add(all_completions)
        return [1.0, 1.0]

    call_reward_function(f, PROMPTS, [C1, C2, C3])
    assert rec.calls == [(([C1, C2, C3],), {})]


def test_other_positional_counts_get_the_lists():
    rec = Recorder()

    def f(x, y, z=None, w=None):  # P = 4 for N = 2
        rec.add(x, y, z, w)
        return [0.0, 0.0]

    call_reward_function(f, PROMPTS, [C1, C2])
    assert rec.calls == [((C1, C2, None, None), {})]


def test_keyword_extras():
    rec = Recorder()

    def kw_only(x, y, *, batch_items=None, prompts=None):
        rec.add(x, y, batch_items=batch_items, prompts=prompts)
        return [0.0, 0.0]

    call_reward_function(kw_only, PROMPTS, [C1, C2], ITEMS)
    assert rec.calls[-1] == ((C1, C2), {"batch_items": ITEMS, "prompts": PROMPTS})

    def var_kw(x, y, **kwargs):
        rec.add(x, y, **kwargs)
        return [0.0, 0.0]

    call_reward_function(var_kw, PROMPTS, [C1, C2], ITEMS)
    assert rec.calls[-1] == ((C1, C2), {"batch_items": ITEMS, "prompts": PROMPTS})

    # Without batch_items, only prompts is passed.
    call_reward_function(var_kw, PROMPTS, [C1, C2])
    assert rec.calls[-1] == ((C1, C2), {"prompts": PROMPTS})

    def items_only(x, y, *, batch_items):
        rec.add(x, y, batch_items=batch_items)
        return [0.0, 0.0]

    call_reward_function(items_only, PROMPTS, [C1, C2], ITEMS)
    assert rec.calls[-1] == ((C1, C2), {"batch_items": ITEMS})


def test_partial_keyword_bindings_are_not_counted():
    rec = Recorder()

    def g(x, y, scale):
        rec.add(x, y, scale=scale)
        return [scale, scale]

    f = functools.partial(g, scale=3)
    assert call_reward_function(f, PROMPTS, [C1, C2]) == [3.0, 3.0]
    assert rec.calls == [((C1, C2), {"scale": 3})]


def test_type_error_retries_with_the_lists():
    rec = Recorder()

    def f(x, y, z=None):  # P = N + 1: first call is (prompts, c1, c2)
        if z is not None:
            raise TypeError("no prompts please")
        rec.add(x, y)
        return [2.0, 2.0]

    assert call_reward_function(f, PROMPTS, [C1, C2]) == [2.0, 2.0]
    assert rec.calls == [((C1, C2), {})]


def test_original_type_error_is_raised_when_the_retry_fails():
    attempts = []

    def f(x, y, z=None):
        attempts.append((x, y, z))
        raise TypeError(f"attempt {len(attempts)}")

    with pytest.raises(TypeError, match="attempt 1"):
        call_reward_function(f, PROMPTS, [C1, C2])
    assert attempts == [(PROMPTS, C1, C2), (C1, C2, None)]


def test_uninspectable_signature_tries_three_forms_in_order():
    calls = []

    class Opaque:
        @property
        def __signature__(self):
            raise ValueError("no signature")

        def __call__(self, *args, **kwargs):
            calls.append((args, kwargs))
            if len(calls) < 3:
                raise TypeError("not this form")
            return [5.0]

    assert call_reward_function(Opaque(), PROMPTS, [C1, C2], ITEMS) == [5.0]
    assert calls == [((C1, C2), {"batch_items": ITEMS}), ((C1, C2), {}), (([C1, C2],), {})]


# --- coercion ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (torch.tensor([[1.5], [2.0]]), [1.5, 2.0]),
        (torch.tensor(0.25), [0.25]),
        ([1, 2], [1.0, 2.0]),
        ((3, 4.5), [3.0, 4.5]),
        (7, [7.0]),
        (0.5, [0.5]),
        ([torch.tensor(1.25), 2], [1.25, 2.0]),
        (True, [1.0]),
    ],
)
def test_return_coercion(value, expected):
    out = call_reward_function(lambda x, y: value, PROMPTS, [C1, C2])
    assert out == expected
    assert all(type(v) is float for v in out)


# --- the oracle ---------------------------------------------------------------------------------------------

def test_oracle_calls_once_per_joint_response():
    rec = Recorder()

    def rf(x, y, *, batch_items=None, prompts=None):
        rec.add(x, y, batch_items=batch_items, prompts=prompts)
        return [len(x[0]) + 10 * len(y[0])]

    oracle = RewardOracle(rf)
    assert oracle.score(["prompt A", "prompt B"], ["ab", "cde"], {"id": 3}, 3) == (32.0, 32.0)
    assert rec.calls == [((["ab"], ["cde"]), {"batch_items": [{"id": 3}], "prompts": ["prompt A"]})]


def test_reward_processor_is_applied():
    oracle = RewardOracle(lambda x, y: [2.0], RewardProcessors.scale(100))
    assert oracle.score(["p", "p"], ["a", "b"], {}, 0) == (200.0, 2.0)
    oracle = RewardOracle(lambda x, y: [2.0], RewardProcessors.shift(-0.5))
    assert oracle.score(["p", "p"], ["a", "b"], {}, 0) == (1.5, 2.0)


@pytest.mark.parametrize(
    ("returned", "fragment"),
    [
        ([float("nan")], "nan"),
        ([float("inf")], "inf"),
        ([-math.inf], "-inf"),
        ([None], "None"),
        (None, "None"),
        ([1.0, 2.0], "2 values"),
        ([], "0 values"),
        (["not a number"], "not a number"),
    ],
)
def test_oracle_rejects_bad_values_naming_the_item(returned, fragment):
    oracle = RewardOracle(lambda x, y: returned)
    with pytest.raises(RewardError) as err:
        oracle.score(["p", "p"], ["a", "b"], {"id": 41}, 41)
    assert "task item 41" in str(err.value)
    assert fragment in str(err.value)
    assert isinstance(err.value, ValueError)


def test_oracle_wraps_a_raising_reward():
    def rf(x, y):
        raise KeyError("missing_field")

    with pytest.raises(RewardError, match="task item train/5") as err:
        RewardOracle(rf).score(["p", "p"], ["a", "b"], {}, "train/5")
    assert "KeyError" in str(err.value) and "missing_field" in str(err.value)
    assert isinstance(err.value.__cause__, KeyError)


def test_processor_errors_name_the_item():
    with pytest.raises(RewardError, match="task item 2") as err:
        RewardOracle(lambda x, y: [1.0], lambda r: r / 0).score(["p", "p"], ["a", "b"], {}, 2)
    assert "reward_processor" in str(err.value)
    with pytest.raises(RewardError, match="processed reward is nan on task item 9"):
        RewardOracle(lambda x, y: [1.0], lambda r: float("nan")).score(["p", "p"], ["a", "b"], {}, 9)


def test_oracle_argument_checks():
    with pytest.raises(ValueError, match="reward_func must be a callable"):
        RewardOracle("not callable")
    with pytest.raises(ValueError, match="reward_processor must be a callable or None"):
        RewardOracle(lambda x, y: [0.0], reward_processor=3)


def test_processors_and_reward_range():
    assert RewardProcessors.scale(3.0)(2.0) == 6.0
    assert RewardProcessors.scale(-1)(0.5) == -0.5
    assert RewardProcessors.shift(-1.0)(2.0) == 1.0
    assert RewardProcessors.shift(0.25)(0.0) == 0.25

    def rf(x, y):
        return [0.0]

    assert set_reward_range(rf, 0, 2) is rf
    assert rf.reward_range == (0.0, 2.0)
    assert all(type(v) is float for v in rf.reward_range)


def test_reward_returning_none_is_called_once():
    from comlrl_lightning.rewards import RewardError, RewardOracle

    calls = []

    def reward(a, b):
        calls.append(1)
        return None

    with pytest.raises(RewardError, match="task item 3"):
        RewardOracle(reward).score(["p"], ["x", "y"], {}, 3)
    assert len(calls) == 1


def test_reward_shift_and_scale_are_named_by_yaml_and_pickle():
    """CoMLRL's reward_processor {shift: v} / {scale: f} as classes: YAML instantiates them by class_path (the code
    configs use RewardShift(-4)), they pickle for spawned processes, and a non-finite value is refused by name."""
    import pickle

    from jsonargparse import ArgumentParser

    from comlrl_lightning.rewards import RewardScale, RewardShift

    p = ArgumentParser()
    p.add_argument("--rp", type=Callable | str | None, default=None)
    cfg = p.parse_args(['--rp={"class_path": "comlrl_lightning.rewards.RewardShift", "init_args": {"value": -4}}'])
    shift = p.instantiate(cfg).rp
    assert isinstance(shift, RewardShift) and shift(4.0) == 0.0 and shift(1.5) == -2.5
    assert pickle.loads(pickle.dumps(RewardScale(0.5)))(3.0) == 1.5
    assert isinstance(RewardProcessors.shift(1), RewardShift) and isinstance(RewardProcessors.scale(2), RewardScale)
    with pytest.raises(ValueError, match=r"RewardShift\(value=nan\)"):
        RewardShift(float("nan"))
