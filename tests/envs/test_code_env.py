"""The code environment: extraction, reward terms, formatters, transitions, problem loading."""

from __future__ import annotations

import inspect
import json
import logging

import pytest

from comlrl_lightning.envs.code import (
    FORMATTERS,
    aux_formatter,
    code_reward_func,
    code_rewards,
    load_code_problems,
    main_formatter,
    make_code_reward_func,
    make_code_transition,
    parse_sandbox_slice,
    run_tests_many,
    slice_tests,
)
from comlrl_lightning.envs.code.analysis import (
    analyze,
    clean_completion,
    extract_function,
    ignored_aux_calls,
    is_thin_wrapper,
)
from comlrl_lightning.envs.code.prompts import function_signature
from comlrl_lightning.envs.code.rewards import MAX_REWARD
from comlrl_lightning.envs.code.sandbox import unavailable_reason
from comlrl_lightning.envs.code.transitions import CodeTransition, parse_expert_edits

SANDBOX_PROBLEM = unavailable_reason()
linux_only = pytest.mark.skipif(SANDBOX_PROBLEM is not None, reason=f"no sandbox here: {SANDBOX_PROBLEM}")

ITEM = {
    "task_id": "t/0",
    "prompt": (
        "from typing import List\n\n\ndef sum_sq(nums: List[int]) -> int:\n"
        '    """Return the sum of the squares of nums.\n    >>> sum_sq([1, 2])\n    5\n    """\n'
    ),
    "entry_point": "sum_sq",
    "test": (
        "\n\nMETADATA = {}\n\n\ndef check(candidate):\n"
        "    assert candidate([1, 2]) == 5\n"
        "    assert candidate([]) == 0\n"
        "    assert candidate([-3]) == 9\n"
        "    assert candidate([1, 1, 1, 1]) == 4\n"
    ),
}

AUX = "```python\ndef aux(x):\n    return x * x\n```"
MAIN_USES_AUX = (
    "Here you go:\n```python\ndef sum_sq(nums):\n    total = 0\n    for n in nums:\n"
    "        total += aux(n)\n    return total\n```\nThis works because..."
)
MAIN_ALONE = "def sum_sq(nums):\n    return sum(n * n for n in nums)\n"
AUX_FULL = "def aux(nums):\n    return sum(n * n for n in nums)\n"
MAIN_WRAPPER = "def sum_sq(nums):\n    return aux(nums)\n"
MAIN_IGNORES = "def sum_sq(nums):\n    aux(nums[0] if nums else 0)\n    return sum(n * n for n in nums)\n"
MAIN_HALF = (
    "def sum_sq(nums):\n    if len(nums) > 1:\n        return 0\n    return sum(aux(n) for n in nums)\n"
)


# ---------------------------------------------------------------------------------------------
# Extraction and static checks


def test_extract_function_from_model_text():
    assert extract_function(AUX, "aux") == "def aux(x):\n    return x * x"
    assert extract_function(MAIN_USES_AUX, "sum_sq").splitlines()[0] == "def sum_sq(nums):"
    assert "This works" not in extract_function(MAIN_USES_AUX, "sum_sq")
    text = "Sure!\n    def helper(a,\n  b):\n        return a\n    def aux(y):\n        return y\nbye"
    assert extract_function(text, "aux") == "def aux(y):\n    return y"
    assert extract_function(text, "helper") == "def helper(a,\nb):\n    return a"
    assert extract_function("no code here", "aux") == ""
    assert clean_completion("text\n```py\ndef a():\n    return 1\n```\n```\ndef b():\n    pass\n```") == (
        "def a():\n    return 1\n\ndef b():\n    pass"
    )


def test_static_analysis_flags():
    a = analyze(AUX, MAIN_USES_AUX, "sum_sq", ITEM["prompt"])
    assert a.aux_ok and a.main_ok and a.syntax_ok and a.calls_aux and not a.thin_wrapper
    assert a.combined.startswith("from typing import List\n\ndef aux(x):")
    missing = analyze("def aux(x):\n    print(x)\n", "", "sum_sq")
    assert missing.aux_message == "aux function missing return statement"
    assert missing.main_message == "main function (sum_sq) not defined" and not missing.main_ok
    broken = analyze(AUX, "def sum_sq(nums):\n    return (1 +\n", "sum_sq")
    assert not broken.syntax_ok and broken.syntax_line is not None and broken.syntax_col is not None
    assert ignored_aux_calls(MAIN_IGNORES) == ["Line 2: aux(nums[0] if nums else 0)"]
    assert is_thin_wrapper(MAIN_WRAPPER)
    assert is_thin_wrapper('def m(x):\n    """doc"""\n    r = aux(x)\n    return r\n')
    assert not is_thin_wrapper("def m(x):\n    return aux(x) + 1\n")
    assert not is_thin_wrapper(MAIN_USES_AUX.split("```python\n")[1].split("```")[0])


def test_main_that_brings_its_own_aux_does_not_call_aux():
    from comlrl_lightning.envs.code.analysis import calls_aux

    assert calls_aux("def m(x):\n    return [aux(v) for v in x]\n")
    for own in ("def m(x, aux=lambda v: v):\n    return aux(x)\n",
                "def m(x):\n    aux = abs\n    return aux(x)\n",
                "def m(x):\n    from math import fabs as aux\n    return aux(x)\n",
                "def m(x):\n    def aux(v):\n        return v\n    return aux(x)\n",
                "def m(x):\n    global aux\n    aux = abs\n    return aux(x)\n",
                "def m(x, *aux):\n    return aux[0](x) if aux else aux(x)\n"):
        assert not calls_aux(own), own


def test_completion_level_imports_are_kept():
    aux = "import itertools\n\ndef aux(xs):\n    return list(itertools.accumulate(xs))\n"
    a = analyze(aux, MAIN_ALONE, "sum_sq", ITEM["prompt"])
    assert a.imports == ["from typing import List", "import itertools"]


# ---------------------------------------------------------------------------------------------
# Reward terms


@linux_only
@pytest.mark.parametrize(
    "aux, main, expected",
    [
        # 0.4 aux + 0.6 main + 0.5 syntax + 1.0 tests + 0.5 uses aux + 1.0 not a wrapper
        pytest.param(AUX, MAIN_USES_AUX, 4.0, id="full-collaboration"),
        # no aux: 0.6 + 0.5 + 1.0, no bonus
        pytest.param("", MAIN_ALONE, 2.1, id="main-alone"),
        # aux defined but unused: 0.4 + 0.6 + 0.5 + 1.0
        pytest.param(AUX, MAIN_ALONE, 2.5, id="aux-unused"),
        # thin wrapper: everything but the 1.0 anti-wrapper bonus
        pytest.param(AUX_FULL, MAIN_WRAPPER, 3.0, id="thin-wrapper"),
        # aux result ignored: full marks minus 0.5
        pytest.param(AUX, MAIN_IGNORES, 3.5, id="aux-result-ignored"),
        # main missing stops scoring after the aux term
        pytest.param(AUX, "I could not solve it.", 0.4, id="main-missing"),
        # syntax error stops after the definition terms
        pytest.param(AUX, "def sum_sq(nums):\n    return (1 +\n", 1.0, id="syntax-error"),
        # 2 of 4 tests pass: 0.4 + 0.6 + 0.5 + 0.5 + 0.5 + 1.0
        pytest.param(AUX, MAIN_HALF, 3.5, id="half-tests"),
        # aux missing its return: no 0.4; main alone is right
        pytest.param("def aux(x):\n    print(x)\n", MAIN_ALONE, 2.1, id="aux-without-return"),
        # no test passes: no bonus even though main calls aux
        pytest.param(AUX, "def sum_sq(nums):\n    return aux(-1)\n", 1.5, id="no-test-passes"),
    ],
)
def test_reward_terms(aux, main, expected):
    assert code_reward_func([aux], [main], batch_items=[ITEM]) == [pytest.approx(expected)]


@linux_only
def test_reward_breakdown_and_timeouts():
    loop = "def sum_sq(nums):\n    while True:\n        pass\n    return 0\n"
    reward = make_code_reward_func(timeout_s=0.5, max_timeouts=1)
    (b,) = code_rewards([AUX], [loop], [ITEM], timeout_s=0.5, max_timeouts=1)
    assert (b.passed, b.total_tests, b.tests) == (0, 4, 0.0)
    assert reward([AUX], [loop], batch_items=[ITEM]) == [pytest.approx(1.5)]
    assert MAX_REWARD == pytest.approx(4.0) and reward.reward_range == (0.0, 4.0)


@linux_only
def test_reward_func_batching_and_dispatch_shape():
    sig = inspect.signature(code_reward_func)
    positional = [p for p in sig.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert len(positional) == 2  # docs/multiturn.md §6.1: P == N -> f(c1, c2), plus batch_items=
    assert sig.parameters["batch_items"].kind is inspect.Parameter.KEYWORD_ONLY
    out = code_reward_func([AUX, AUX, ""], [MAIN_USES_AUX, MAIN_ALONE, ""], batch_items=[ITEM])
    assert out == [pytest.approx(4.0), pytest.approx(2.5), 0.0]  # one item broadcast to all
    with pytest.raises(ValueError, match="batch_items"):
        code_reward_func([AUX], [MAIN_ALONE])
    with pytest.raises(ValueError, match="2 items for 3 completions"):
        code_reward_func([AUX] * 3, [MAIN_ALONE] * 3, batch_items=[ITEM, ITEM])
    with pytest.raises(ValueError, match="'test'"):
        code_reward_func([AUX], [MAIN_ALONE], batch_items=[{"prompt": "", "entry_point": "sum_sq"}])


# ---------------------------------------------------------------------------------------------
# Formatters


def test_formatters():
    assert function_signature(ITEM["prompt"], "sum_sq") == "def sum_sq(nums: List[int])"
    assert function_signature("nothing", "f") == "def f(...)"
    aux, main = (f(ITEM) for f in FORMATTERS)
    assert "def aux(...)" in aux and ITEM["prompt"].strip() in aux and "do not implement `sum_sq`" in aux
    assert "def sum_sq(nums: List[int])" in main and "aux(...)" in main and ITEM["prompt"].strip() in main
    assert aux_formatter(ITEM, external_prompts="feedback text") == "feedback text"
    assert main_formatter(ITEM, external_prompts="more") == "more"
    with pytest.raises(ValueError, match="entry_point"):
        main_formatter({"prompt": "x", "task_id": "bad/1"})


# ---------------------------------------------------------------------------------------------
# sandbox_slice


@pytest.mark.parametrize(
    "value, expected",
    [
        ("all", 0),
        ("ALL", 0),
        ("3", 3),
        ("-2", -2),
        ("first", None),
        (5, 5),
        (-1, -1),
        (0, 0),
        (None, None),
        (2.5, 0),
        ([1], 0),
    ],
)
def test_parse_sandbox_slice(value, expected):
    assert parse_sandbox_slice(value) == expected


def test_slice_tests():
    first = slice_tests(ITEM["test"], 1)
    assert first == "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate([1, 2]) == 5\n"
    last = slice_tests(ITEM["test"], -2)
    assert last.endswith("    assert candidate([-3]) == 9\n    assert candidate([1, 1, 1, 1]) == 4\n")
    assert slice_tests(ITEM["test"], 0) == ITEM["test"] == slice_tests(ITEM["test"], None)
    assert slice_tests(ITEM["test"], 10).count("assert") == 4
    no_asserts = "def check(candidate):\n    pass\n"
    assert slice_tests(no_asserts, 1) == no_asserts


# ---------------------------------------------------------------------------------------------
# Transitions


@pytest.mark.sandbox  # a code transition checks at construction that the sandbox can run
def test_mode_aliases_and_argument_checks():
    for alias, mode in [
        ("plain", "plain"),
        ("Feedback", "level_feedback"),
        ("level_feedback", "level_feedback"),
        ("expert", "expert_edits"),
        ("edits", "expert_edits"),
        ("EXPERT_EDITS", "expert_edits"),
    ]:
        options = {"client": lambda messages: "{}"} if mode == "expert_edits" else {}
        assert make_code_transition(alias, **options).mode == mode
    for alias, mode in [("level_passed", "level_passed"), ("Signals", "level_passed"), ("passed", "passed")]:
        assert make_code_transition(alias).mode == mode
    with pytest.raises(ValueError, match="not supported"):
        make_code_transition("bogus")
    with pytest.raises(ValueError, match="client"):
        make_code_transition("expert_edits")
    t = make_code_transition("plain", problems=[ITEM])
    with pytest.raises(ValueError, match="supports 2 agents"):
        t(ITEM["prompt"], [AUX, MAIN_ALONE, MAIN_ALONE], 3)
    with pytest.raises(ValueError, match="one completion per agent"):
        t(ITEM["prompt"], [AUX], 2)


@pytest.mark.sandbox  # a code transition checks at construction that the sandbox can run
def test_plain_prompts():
    t = make_code_transition("plain", problems=[ITEM])
    aux_p, main_p = t(prompt=ITEM["prompt"], agent_completions=[AUX, "no code"], num_agents=2)
    assert aux_p == (
        "Your previous aux(...) implementation:\ndef aux(x):\n    return x * x\n\n"
        "Revise your aux(...) accordingly. Output ONLY the function code."
    )
    assert main_p == (
        "Your previous main implementation:\n<no implementation found>\n\n"
        "Revise your sum_sq(...) accordingly. Output ONLY the function code."
    )
    with_original = make_code_transition("plain", problems=[ITEM], original_prompt_flag=True)
    aux_p, main_p = with_original(ITEM["prompt"], [AUX, MAIN_ALONE], 2)
    assert aux_p.startswith(aux_formatter(ITEM)) and main_p.startswith(main_formatter(ITEM))
    # an unregistered prompt still works in plain mode: the entry point comes from its last def
    _, main_p = make_code_transition("plain")(ITEM["prompt"], [AUX, MAIN_ALONE], 2)
    assert main_p.endswith("Revise your sum_sq(...) accordingly. Output ONLY the function code.")


@linux_only
def test_level_feedback_prompts():
    t = make_code_transition("level_feedback", problems=[ITEM], sandbox_slice="all", timeout_s=2.0)
    aux_p, main_p = t(ITEM["prompt"], [AUX, MAIN_HALF], 2)
    assert aux_p.splitlines() == [
        "Static and execution diagnostics:",
        "- aux definition: FOUND",
        "- sum_sq definition: FOUND",
        "- Syntax: OK",
        "- Tests: 2/4 passed",
        "- Failed case: assert sum_sq([1, 2]) == 5 -> AssertionError: expected 5, got 0",
        "- Failed case: assert sum_sq([1, 1, 1, 1]) == 4 -> AssertionError: expected 4, got 0",
        "Revise your aux(...) accordingly. Output ONLY the function code with no extra text.",
    ]
    assert main_p.splitlines()[1:3] == ["- sum_sq definition: FOUND", "- aux definition: FOUND"]
    assert "- Aux usage: sum_sq calls aux(...) and uses its result" in main_p
    assert main_p.endswith(
        "Revise your sum_sq(...) accordingly. Output ONLY the function code with no extra text."
    )

    # default sandbox_slice=1 runs only the first test; misuse and wrapper diagnostics for main
    _, main_p = make_code_transition("feedback", problems=[ITEM])(ITEM["prompt"], [AUX, MAIN_IGNORES], 2)
    assert "- Tests: 1/1 passed" in main_p
    assert "misuses it (result ignored: Line 2: aux(nums[0] if nums else 0))" in main_p
    _, main_p = make_code_transition("feedback", problems=[ITEM])(ITEM["prompt"], [AUX_FULL, MAIN_WRAPPER], 2)
    assert "- Warning: sum_sq is a thin wrapper around aux(...); add real logic of its own." in main_p
    _, main_p = make_code_transition("feedback", problems=[ITEM])(ITEM["prompt"], [AUX, MAIN_ALONE], 2)
    assert "- Aux usage: sum_sq does NOT call aux(...)" in main_p


@linux_only
def test_level_feedback_syntax_error_missing_definitions_and_history():
    item = dict(ITEM, test="def check(candidate):\n    pass\n")
    t = make_code_transition("level_feedback", sandbox_slice=-1).bind(item)
    broken = "def sum_sq(nums):\n    return (1 +\n"
    aux_p, main_p = t(
        "any prompt",
        [AUX, broken],
        2,
        prompt_history_per_agent=[["aux turn-0 prompt"], ["main turn-0 prompt"]],
        response_history_per_agent=[[AUX], [broken]],
    )
    lines = aux_p.splitlines()
    assert lines[:3] == ["History: previous prompts", "- Turn 1 prompt:", "aux turn-0 prompt"]
    assert (
        "History: your previous aux responses" in lines and "History: your previous main responses" in main_p
    )
    assert any(ln.startswith("- Syntax: ERROR (syntax error:") for ln in lines)
    # combined code: import, blank, aux (2 lines), blank, main: the open "(" is on line 7
    assert any(ln.startswith("- SyntaxError at line 7, column") for ln in lines)
    assert "- Tests: no test cases found" in lines
    aux_p, _ = t("x", ["nothing", "nothing"], 2)
    assert "- aux definition: MISSING (aux function not defined)" in aux_p
    assert "- sum_sq definition: MISSING (main function (sum_sq) not defined)" in aux_p
    no_history = make_code_transition("level_feedback", include_history=False).bind(item)
    assert no_history("x", [AUX, broken], 2, [["p"], ["q"]], [["a"], ["b"]]).count("History") == 0


@linux_only
def test_level_passed_signals():
    t = make_code_transition("signals", problems=[ITEM], sandbox_slice="all", timeout_s=2.0)
    aux_p, main_p = t(ITEM["prompt"], [AUX, MAIN_HALF], 2)
    assert aux_p.splitlines() == [
        "Your previous aux(...) implementation:", "def aux(x):", "    return x * x", "",
        "Signals:", "- Implementation: OK", "- Syntax: Syntax correct", "- Tests: Passed 2/4 tests", "",
        "Revise your aux(...) accordingly. Output ONLY the function code.",
    ]
    lines = main_p.splitlines()
    assert lines[0] == "Your previous main implementation:" and lines[1] == "def sum_sq(nums):"
    assert lines[-7:] == [
        "Signals:", "- Implementation: OK", "- Syntax: Syntax correct", "- Tests: Passed 2/4 tests",
        "- Aux usage: Aux call present and used", "", "Revise your sum_sq(...) accordingly. Output ONLY the function code.",
    ]
    assert "- Tests: Passed all tests" in t(ITEM["prompt"], [AUX, MAIN_USES_AUX], 2)[1]
    assert "- Aux usage: Main does not call aux" in t(ITEM["prompt"], [AUX, MAIN_ALONE], 2)[1]
    assert "- Aux usage: Aux called but result not used properly" in t(ITEM["prompt"], [AUX, MAIN_IGNORES], 2)[1]
    aux_p, main_p = t(ITEM["prompt"], ["nothing", "nothing"], 2)
    assert "- Implementation: No implementation found in required structure" in aux_p
    assert "<no implementation found>" in main_p and "- Aux usage: Main missing; cannot check aux usage" in main_p
    assert "- Tests: No tests passed" in main_p
    broken = make_code_transition("level_passed", problems=[ITEM])(ITEM["prompt"], [AUX, "def sum_sq(n):\n  return (\n"], 2)
    assert "- Syntax: Syntax not correct" in broken[0] and "- Tests: No tests passed" in broken[0]
    no_tests = make_code_transition("level_passed").bind(dict(ITEM, test=""))
    assert "- Tests: No tests found" in no_tests("x", [AUX, MAIN_ALONE], 2)[1]
    # CoMLRL's external keys: original_prompt adds the first-turn instruction, previous_response=False drops the code
    from comlrl_lightning.envs.code.prompts import aux_prompt
    from comlrl_lightning.envs.code.transitions import external_options

    flags = make_code_transition(**external_options({"mode": "signals", "original_prompt": True,
                                                     "previous_response": False}), problems=[ITEM])
    aux_p, main_p = flags(ITEM["prompt"], [AUX, MAIN_USES_AUX], 2)
    assert aux_p.startswith(aux_prompt(ITEM) + "\n\nSignals:") and "previous" not in main_p


@linux_only
def test_passed_single_signal():
    t = make_code_transition("passed", problems=[ITEM], sandbox_slice="all", timeout_s=2.0)
    aux_p, main_p = t(ITEM["prompt"], [AUX, MAIN_USES_AUX], 2)
    assert aux_p.splitlines()[-3:] == ["Signal: All levels passed", "",
                                        "Revise your aux(...) if needed. Output ONLY the function code."]
    assert main_p.startswith("Your previous main implementation:\ndef sum_sq(nums):")
    assert main_p.endswith("Signal: All levels passed\n\nRevise your sum_sq(...) if needed. Output ONLY the function code.")
    assert "Signal: Not all levels passed" in t(ITEM["prompt"], [AUX, MAIN_HALF], 2)[0]
    assert "Signal: Not all levels passed" in t(ITEM["prompt"], [AUX, "nothing"], 2)[1]  # main missing
    # no tests means not passed
    assert "Signal: Not all levels passed" in make_code_transition("passed").bind(dict(ITEM, test=""))(
        "x", [AUX, MAIN_ALONE], 2)[1]


@pytest.mark.sandbox  # a code transition checks at construction that the sandbox can run
@pytest.mark.parametrize("mode", ["level_passed", "passed"])
def test_signal_modes_need_the_task(mode):
    with pytest.raises(ValueError, match="register"):
        make_code_transition(mode)("def unknown():\n    pass\n", [AUX, MAIN_ALONE], 2)


@pytest.mark.sandbox  # a code transition checks at construction that the sandbox can run
def test_level_feedback_needs_the_task():
    with pytest.raises(ValueError, match="register"):
        make_code_transition("level_feedback")("def unknown():\n    pass\n", [AUX, MAIN_ALONE], 2)
    t = make_code_transition("level_feedback").register([ITEM])
    # whitespace differences in the prompt do not matter
    assert t.resolve("  " + ITEM["prompt"].replace("\n", "\n ") + "\n")["entry_point"] == "sum_sq"


@pytest.mark.sandbox  # a code transition checks at construction that the sandbox can run
def test_expert_edits_prompts_retries_and_fallback(caplog):
    calls = []

    def client(messages):
        calls.append(messages)
        if len(calls) == 1:
            raise TimeoutError("slow expert")
        if len(calls) == 2:
            return "no json here"
        return 'Reasoning {"aux": "x"} ... final: {"aux": "Square x.", "main": "Perfect! No changes needed!"}'

    t = make_code_transition("expert_edits", problems=[ITEM], client=client, max_retries=3)
    aux_p, main_p = t(ITEM["prompt"], [AUX, MAIN_USES_AUX], 2)
    assert len(calls) == 3 and calls[0][-1]["role"] == "user"
    assert "def aux(x):" in calls[0][-1]["content"] and '"aux" and "main"' in calls[0][-1]["content"]
    # the first-turn block, the agent's own previous code, then the expert's edits
    assert aux_p.startswith(aux_formatter(ITEM) + "\n\nYour previous aux(...) implementation:\ndef aux(x):")
    assert aux_p.endswith("\n\nHere is the feedback from an expert:\nSquare x.")
    assert main_p.startswith(main_formatter(ITEM) + f"\n\nYour previous {ITEM['entry_point']}(...) implementation:\n")
    assert main_p.endswith("\n\nHere is the feedback from an expert:\nPerfect! No changes needed!")

    def broken(messages):
        return "I refuse to answer in JSON"

    with caplog.at_level(logging.WARNING, logger="comlrl_lightning.envs.code.transitions"):
        aux_p, main_p = make_code_transition("edits", problems=[ITEM], client=broken, max_retries=2)(
            ITEM["prompt"], [AUX, MAIN_ALONE], 2
        )
    assert aux_p.startswith(aux_formatter(ITEM)) and main_p.startswith(main_formatter(ITEM))  # empty edits
    assert "feedback from an expert" not in aux_p + main_p
    assert "using empty edits" in caplog.text
    # unknown task and no entry point: edits appended to the raw prompt
    raw = make_code_transition("expert", client=lambda m: '{"aux": "A", "main": "B"}')
    assert raw("Write something.", ["", ""], 2) == [
        "Write something.\n\nYour previous aux(...) implementation:\n<no implementation found>"
        "\n\nHere is the feedback from an expert:\nA",
        "Write something.\n\nYour previous main(...) implementation:\n<no implementation found>"
        "\n\nHere is the feedback from an expert:\nB",
    ]


def test_parse_expert_edits():
    assert parse_expert_edits('{"aux": "a"} then {"main": {"k": 1}}') == {"aux": "", "main": '{"k": 1}'}
    assert parse_expert_edits('{"other": 1}') is None and parse_expert_edits("") is None


@pytest.mark.sandbox  # a code transition checks at construction that the sandbox can run
def test_bind_returns_an_independent_transition():
    t = make_code_transition("plain")
    bound = t.bind(ITEM)
    assert isinstance(bound, CodeTransition) and bound is not t
    assert bound.resolve("whatever")["entry_point"] == "sum_sq"
    assert t.resolve("def other(x):\n    pass")["entry_point"] == "other"


# ---------------------------------------------------------------------------------------------
# Problems


def test_builtin_problems_load_and_canonical_solutions_pass(tmp_path):
    ds = load_code_problems(cache_dir=str(tmp_path))
    assert len(ds) >= 20
    assert len(set(ds["task_id"])) == len(ds) and len(set(ds["entry_point"])) == len(ds)
    if SANDBOX_PROBLEM is None:
        jobs = [(row["prompt"] + row["canonical_solution"], row["test"], row["entry_point"]) for row in ds]
        results = run_tests_many(jobs, timeout_s=5.0)
        for row, res in zip(ds, results, strict=True):
            assert len(res) >= 4 and all(r.passed for r in res), (row["task_id"], res)
    assert len(load_code_problems(split="train[:3]", cache_dir=str(tmp_path))) == 3


def test_local_files_and_validation(tmp_path):
    rows = [dict(ITEM), dict(ITEM, task_id="t/1")]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert load_code_problems(jsonl, cache_dir=str(tmp_path / "c"))["task_id"] == ["t/0", "t/1"]
    as_json = tmp_path / "p.json"
    as_json.write_text(json.dumps(rows))
    assert len(load_code_problems(str(as_json), cache_dir=str(tmp_path / "c"))) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps(ITEM) + "\n" + json.dumps({k: v for k, v in ITEM.items() if k != "test"}) + "\n"
    )
    with pytest.raises(ValueError, match=r"row 1 of .*bad\.jsonl is missing field 'test'"):
        load_code_problems(bad, cache_dir=str(tmp_path / "c"))
    with pytest.raises(FileNotFoundError):
        load_code_problems(tmp_path / "absent.jsonl")
    with pytest.raises(ValueError, match="single split 'train'"):
        load_code_problems(jsonl, split="test")


def test_hub_name_fails_fast_when_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="offline"):
        load_code_problems("openai/openai_humaneval", split="test")


@pytest.mark.sandbox  # a code transition checks at construction that the sandbox can run
def test_expert_edits_through_http_client_on_loopback(monkeypatch):
    """expert_edits asks a real (loopback) OpenAI-style server through the project's HTTP client."""
    from fake_llm_server import FakeLLMServer, http_error

    server = FakeLLMServer().start()
    try:
        server.texts = lambda protocol, body, i: '{"aux": "Square x.", "main": "Call aux."}'
        server.enqueue(http_error(500))  # one scripted failure: retried by the client
        monkeypatch.setenv("EXPERT_TEST_KEY", "sk-dummy-expert-key")
        t = make_code_transition("expert_edits", problems=[ITEM], expert_url=server.url("openai"),
                                 expert_model="expert-1", expert_key_env="EXPERT_TEST_KEY")
        aux_p, main_p = t(ITEM["prompt"], [AUX, MAIN_USES_AUX], 2)
    finally:
        server.stop()
    assert aux_p.endswith("Here is the feedback from an expert:\nSquare x.")
    assert main_p.endswith("Here is the feedback from an expert:\nCall aux.")
    bodies = [r.body for r in server.requests]
    assert len(bodies) == 2 and bodies[-1]["model"] == "expert-1"
    assert "def aux(x):" in bodies[-1]["messages"][0]["content"]
    assert server.requests[-1].headers["authorization"] == "Bearer sk-dummy-expert-key"
