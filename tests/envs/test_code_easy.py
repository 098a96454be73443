"""The easy tier of built-in code problems (envs/code/data/problems_easy.jsonl): well formed, and every canonical
solution passes its tests in the sandbox while a wrong one does not."""

from __future__ import annotations

import pytest

from comlrl_lightning.envs.code.problems import EASY_PROBLEMS, load_code_problems
from comlrl_lightning.envs.code.rewards import code_rewards


@pytest.fixture(scope="module")
def easy():
    return [dict(r) for r in load_code_problems(EASY_PROBLEMS)]


def test_easy_tier_is_well_formed(easy):
    from comlrl_lightning.data.sources import load_task_items

    assert len(easy) == 24 and len({r["task_id"] for r in easy}) == 24
    assert [r["task_id"] for r in load_task_items("builtin:code_easy[-3:]")] == [r["task_id"] for r in easy[-3:]]
    for r in easy:
        assert f"def {r['entry_point']}(" in r["prompt"] and r["test"].count("assert candidate(") >= 4


@pytest.mark.sandbox
def test_canonical_solutions_pass_and_wrong_ones_fail(easy):
    mains = [r["prompt"] + r["canonical_solution"] for r in easy]
    good = code_rewards([""] * len(easy), mains, easy, timeout_s=10.0)
    assert all(b.total_tests >= 4 and b.passed == b.total_tests for b in good), [b for b in good if b.passed < 4][:3]
    wrong = [r["prompt"] + "    return None\n" for r in easy]
    bad = code_rewards([""] * len(easy), wrong, easy, timeout_s=10.0)
    assert all(b.passed < b.total_tests for b in bad)
    assert all(g.total > b.total for g, b in zip(good, bad))
