"""External transitions of the code environment (docs/multiturn.md §5 and §5.1).

``make_code_transition(mode, problems=..., **options)`` returns a :class:`CodeTransition`, a
callable with the standard signature::

    transition(prompt, agent_completions, num_agents,
               prompt_history_per_agent=None, response_history_per_agent=None) -> [aux_prompt, main_prompt]

**How the task reaches the transition.** The trainer passes only the item's raw ``prompt``. Like
upstream's context resolver, the transition keeps a table from the whitespace-normalised prompt
to the task (``entry_point``, ``test``): fill it with ``problems=`` (any iterable of task dicts,
e.g. the train and eval datasets) or ``register(items)``. ``bind(item)`` returns a copy fixed to
one task, for callers that drive a single item. An unknown prompt still gets an entry point parsed
from its last ``def``, but ``level_feedback``, ``level_passed`` and ``passed`` then raise: they cannot run
tests they do not know.

Modes (case-insensitive; aliases of docs/multiturn.md §5.1): ``plain``; ``level_feedback`` | ``feedback``;
``level_passed`` | ``signals`` (compact signals: implementation, syntax, tests, aux usage); ``passed`` (one
pass/fail signal); ``expert_edits`` | ``expert`` | ``edits``. :func:`external_options` maps CoMLRL's
``external.*`` config keys (``mode``, ``original_prompt``, ``previous_response``, ...) onto these options.

Follow-up prompts of ``plain`` and ``expert_edits`` show the agent its own previous code; ``plain`` and
``level_feedback`` add the prompt/response history when the trainer passes it (``include_history``).
``expert_edits`` without ``client``/``expert_url`` uses the default expert, ``deepseek-coder``, at its
OpenAI-compatible endpoint with the key from ``DEEPSEEK_API_KEY`` (``expert_model`` names another backend:
"claude" → Anthropic with ``ANTHROPIC_API_KEY``, "qwen3-coder" → DashScope with ``DASHSCOPE_API_KEY``, anything
else → an OpenAI-compatible endpoint from ``EXPERT_API_URL`` with the key from ``EXPERT_API_KEY``).

The prompts are meant to be used as they are (``external_prompt_passthrough=True``, or the
formatters of :mod:`comlrl_lightning.envs.code.prompts`, which pass them through).

Why one file of this length: the five modes are one state machine over one task table (the test run they
share, the slicing, the history sections and the previous code); split per mode, each file would repeat
that state and the routing, and the mode aliases would live apart from the modes they name.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from comlrl_lightning.envs.code.analysis import AUX_NAME, CodeAnalysis, analyze
from comlrl_lightning.envs.code.prompts import aux_prompt, main_prompt
from comlrl_lightning.envs.code.sandbox import extract_test_cases, require_sandbox, run_cases, test_setup_code

log = logging.getLogger(__name__)

MODE_ALIASES = {
    "plain": "plain",
    "level_feedback": "level_feedback",
    "feedback": "level_feedback",
    "expert_edits": "expert_edits",
    "expert": "expert_edits",
    "edits": "expert_edits",
    "level_passed": "level_passed",
    "signals": "level_passed",
    "passed": "passed",
}
_RUNS_TESTS = ("level_feedback", "level_passed", "passed")  # modes that need the task's tests
NO_CHANGES = "Perfect! No changes needed!"


def normalize_mode(mode: str) -> str:
    """Canonical mode name for `mode` or one of its aliases (ValueError otherwise)."""
    key = str(mode).strip().lower()
    if key in MODE_ALIASES:
        return MODE_ALIASES[key]
    raise ValueError(f"external transition mode {mode!r} is not supported; allowed: {sorted(MODE_ALIASES)}")


def parse_sandbox_slice(value) -> int | None:
    """``sandbox_slice`` option (docs/multiturn.md §5.1): "all" -> 0; numeric string -> int; other string ->
    None; int -> itself; None -> None; any other type -> 0. 0 and None both mean all tests."""
    if value is None:
        return None
    if isinstance(value, bool):  # bool is an int subclass; the spec's table has no row for it
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "all":
            return 0
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        return None
    return 0


def slice_tests(test_code: str, n: int | None) -> str:
    """Keep the first n asserts of ``check(candidate)`` (n > 0), or the last |n| (n < 0).

    The preamble before ``def check(candidate):`` is kept; the selected stripped assert lines
    that mention ``candidate`` are re-emitted under a fresh header, indented by four spaces.
    0/None, or test code without such asserts, returns the test code unchanged.
    """
    if not n or not test_code:
        return test_code
    lines = test_code.splitlines()
    header = next(
        (i for i, ln in enumerate(lines) if re.match(r"\s*def\s+check\s*\(\s*candidate\s*\)\s*:", ln)), None
    )
    if header is None:
        return test_code
    asserts = [
        ln.strip() for ln in lines[header + 1 :] if ln.strip().startswith("assert") and "candidate" in ln
    ]
    if not asserts:
        return test_code
    chosen = asserts[:n] if n > 0 else asserts[n:]
    preamble = "\n".join(lines[:header]).rstrip()
    body = "\n".join("    " + a for a in chosen)
    return (preamble + "\n\n\n" if preamble else "") + "def check(candidate):\n" + body + "\n"


def _normalize_prompt(prompt: str) -> str:
    return " ".join((prompt or "").split())


def _last_def_name(prompt: str) -> str | None:
    names = re.findall(r"^\s*def\s+(\w+)\s*\(", prompt or "", re.MULTILINE)
    return names[-1] if names else None


def parse_expert_edits(text: str) -> dict[str, str] | None:
    """The last JSON object in `text` that has an ``aux`` or ``main`` key, as {"aux", "main"} strings."""
    decoder = json.JSONDecoder()
    found = None
    for match in re.finditer(r"\{", text or ""):
        try:
            obj, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(obj, dict) and ("aux" in obj or "main" in obj):
            found = obj
    if found is None:
        return None

    def as_text(value) -> str:
        if value is None:
            return ""
        return value if isinstance(value, str) else json.dumps(value)

    return {"aux": as_text(found.get("aux")).strip(), "main": as_text(found.get("main")).strip()}


class CodeTransition:
    """A configured code-environment transition. See the module docstring.

    Options (all modes): ``problems`` (task dicts to register), ``include_history`` (True: add the
    history section to ``level_feedback`` prompts when histories are passed).
    ``plain``: ``original_prompt_flag`` (False), ``previous_response_flag`` (True).
    ``level_feedback``, ``level_passed``, ``passed``: ``sandbox_slice`` (1), ``timeout_s`` (10), ``max_timeouts``
    (3), plus sandbox options (``memory_mb``, ...). ``level_passed`` and ``passed`` also take
    ``original_prompt_flag`` (False) and ``previous_response_flag`` (True), as ``plain``.
    ``expert_edits``: ``client`` (``client(messages: list[dict]) -> str``), or ``expert_url`` with
    ``expert_model``, ``expert_format`` ("openai", "anthropic", "openai_responses", "generic") and
    ``expert_key_env`` to use the project's HTTP client, or nothing (the default expert, see the module
    docstring); ``max_retries`` (3). ``previous_response_flag`` also shows the previous code here.
    """

    def __init__(
        self,
        mode: str = "level_feedback",
        *,
        problems: Iterable[Mapping] | None = None,
        sandbox_slice=1,
        timeout_s: float = 10.0,
        max_timeouts: int = 3,
        include_history: bool = True,
        original_prompt_flag: bool = False,
        previous_response_flag: bool = True,
        client: Callable[[list[dict]], str] | None = None,
        max_retries: int = 3,
        expert_url: str | None = None,
        expert_model: str | None = None,
        expert_format: str | None = None,
        expert_key_env: str | None = None,
        **sandbox_options,
    ) -> None:
        self.mode = normalize_mode(mode)
        require_sandbox(sandbox_options.get("isolation", "bwrap"), what=f"the code environment ({self.mode!r} mode)")
        if client is None and (expert_url or self.mode == "expert_edits"):
            from comlrl_lightning.envs.code.expert import default_expert, make_expert_client

            url, fmt, key_env, model = default_expert(expert_model, expert_url, expert_format, expert_key_env)
            client = make_expert_client(url, format=fmt, model=model, key_env=key_env)
        self.sandbox_slice = parse_sandbox_slice(sandbox_slice)
        self.timeout_s = float(timeout_s)
        self.max_timeouts = int(max_timeouts)
        self.include_history = include_history
        self.original_prompt_flag = original_prompt_flag
        self.previous_response_flag = previous_response_flag
        self.client = client
        self.max_retries = int(max_retries)
        self.sandbox_options = sandbox_options
        if self.mode == "expert_edits" and not callable(client):
            raise ValueError(
                "expert_edits mode needs expert_url=<endpoint> (with expert_model/expert_format/"
                "expert_key_env) or client=<callable(messages: list[dict]) -> str> that queries the expert model"
            )
        if self.max_retries < 1:
            raise ValueError(f"max_retries must be >= 1, got {max_retries!r}")
        self._contexts: dict[str, dict] = {}
        self._bound: dict | None = None
        self._previewed = False
        if problems is not None:
            self.register(problems)

    # -- task context ---------------------------------------------------------------------
    def register(self, items: Iterable[Mapping]) -> CodeTransition:
        """Make the tasks of `items` known (keyed by their whitespace-normalised prompt)."""
        for item in items:
            ctx = self._context_of(item)
            self._contexts[_normalize_prompt(ctx["prompt"])] = ctx
        return self

    def bind(self, item: Mapping) -> CodeTransition:
        """A copy of this transition that always uses the task `item`, whatever prompt it gets."""
        clone = object.__new__(CodeTransition)
        clone.__dict__.update(self.__dict__)
        clone._bound = self._context_of(item)
        return clone

    @staticmethod
    def _context_of(item: Mapping) -> dict:
        prompt, entry = item.get("prompt"), item.get("entry_point")
        if not isinstance(prompt, str) or not isinstance(entry, str) or not entry:
            raise ValueError(
                "a code task needs string fields 'prompt' and 'entry_point' "
                f"(task {item.get('task_id', '?')!r})"
            )
        return {
            "prompt": prompt,
            "entry_point": entry,
            "test": item.get("test") or "",
            "task_id": item.get("task_id"),
        }

    def resolve(self, prompt: str) -> dict:
        """The task context for `prompt` (bound task, registered task, or parsed entry point)."""
        if self._bound is not None:
            return self._bound
        ctx = self._contexts.get(_normalize_prompt(prompt))
        if ctx is not None:
            return ctx
        entry = _last_def_name(prompt)
        if self.mode in _RUNS_TESTS:
            raise ValueError(
                f"{self.mode} transition: no task registered for this prompt, so its tests are "
                "unknown; pass problems=<dataset> to make_code_transition, call register(items), "
                "or use bind(item)"
            )
        return {"prompt": prompt, "entry_point": entry, "test": "", "task_id": None}

    # -- the transition -------------------------------------------------------------------
    def __call__(
        self,
        prompt: str,
        agent_completions: Sequence[str],
        num_agents: int,
        prompt_history_per_agent: Sequence[Sequence[str]] | None = None,
        response_history_per_agent: Sequence[Sequence[str]] | None = None,
    ) -> list[str]:
        if num_agents != 2:
            raise ValueError(
                f"External transition currently supports 2 agents (aux, main); got num_agents={num_agents}"
            )
        if not isinstance(agent_completions, (list, tuple)) or len(agent_completions) != 2:
            raise ValueError(
                f"agent_completions must hold one completion per agent (2), got "
                f"{len(agent_completions) if isinstance(agent_completions, (list, tuple)) else 'no list'}"
            )
        ctx = self.resolve(prompt)
        aux_text, main_text = (c if isinstance(c, str) else "" for c in agent_completions)
        if self.mode == "plain":
            prompts = self._plain(ctx, aux_text, main_text, prompt_history_per_agent, response_history_per_agent)
        elif self.mode == "level_feedback":
            prompts = self._level_feedback(
                ctx, aux_text, main_text, prompt_history_per_agent, response_history_per_agent
            )
        elif self.mode in ("level_passed", "passed"):
            prompts = self._signals(ctx, aux_text, main_text)
        else:
            prompts = self._expert_edits(ctx, aux_text, main_text)
        if not self._previewed:
            self._previewed = True
            log.info("code transition %s, first prompts:\n[aux]\n%s\n[main]\n%s", self.mode, *prompts)
        return prompts

    # plain --------------------------------------------------------------------------------
    def _plain(self, ctx: dict, aux_text: str, main_text: str, prompt_history=None, response_history=None) -> list[str]:
        entry = ctx["entry_point"] or "main"
        analysis = analyze(aux_text, main_text, entry, ctx["prompt"])
        out = []
        for role, src in (("aux", analysis.aux_src), ("main", analysis.main_src)):
            parts = []
            if self.original_prompt_flag and ctx["entry_point"]:
                item = {"prompt": ctx["prompt"], "entry_point": ctx["entry_point"]}
                parts.append(aux_prompt(item) if role == "aux" else main_prompt(item))
            if self.include_history:
                history = _history_section(0 if role == "aux" else 1, role, prompt_history, response_history)
                if history:
                    parts.append("\n".join(history).rstrip())
            if self.previous_response_flag:
                label = f"{AUX_NAME}(...)" if role == "aux" else "main"
                parts.append(f"Your previous {label} implementation:\n{src or '<no implementation found>'}")
            name = AUX_NAME if role == "aux" else entry
            parts.append(f"Revise your {name}(...) accordingly. Output ONLY the function code.")
            out.append("\n\n".join(parts))
        return out

    # level_feedback -----------------------------------------------------------------------
    def _run_tests(self, ctx: dict, analysis: CodeAnalysis) -> tuple[list, list]:
        """The (sliced) test cases of the task and their sandbox results (none when the syntax is broken)."""
        test_code = slice_tests(ctx["test"], self.sandbox_slice)
        cases = extract_test_cases(test_code, ctx["entry_point"])
        results = []
        if analysis.syntax_ok and cases:
            results = run_cases(
                analysis.combined,
                cases,
                setup=test_setup_code(test_code),
                # The tests see the team's entry point and the prompt's own helpers only (as the code reward
                # does): a helper or builtin the completions redefine stays in the worker, out of the feedback.
                entry_point=ctx["entry_point"],
                prompt=ctx["prompt"],
                timeout_s=self.timeout_s,
                max_timeouts=self.max_timeouts,
                **self.sandbox_options,
            )
        return cases, results

    def _level_feedback(self, ctx, aux_text, main_text, prompt_history, response_history) -> list[str]:
        entry = ctx["entry_point"]
        analysis = analyze(aux_text, main_text, entry, ctx["prompt"])
        cases, results = self._run_tests(ctx, analysis)
        diagnostics = self._diagnostics(analysis, cases, results)
        out = []
        for agent, role in enumerate(("aux", "main")):
            lines = []
            if self.include_history:
                lines += _history_section(agent, role, prompt_history, response_history)
            lines.append("Static and execution diagnostics:")
            aux_state = "FOUND" if analysis.aux_ok else f"MISSING ({analysis.aux_message})"
            aux_line = f"- aux definition: {aux_state}"
            main_state = "FOUND" if analysis.main_ok else f"MISSING ({analysis.main_message})"
            main_line = f"- {entry} definition: {main_state}"
            lines += [aux_line, main_line] if role == "aux" else [main_line, aux_line]
            lines += diagnostics
            if role == "main":
                lines += _aux_usage_lines(analysis)
                lines.append(
                    f"Revise your {entry}(...) accordingly. Output ONLY the function code with no extra text."
                )
            else:
                lines.append(
                    f"Revise your {AUX_NAME}(...) accordingly. "
                    "Output ONLY the function code with no extra text."
                )
            out.append("\n".join(lines))
        return out

    @staticmethod
    def _diagnostics(analysis: CodeAnalysis, cases, results) -> list[str]:
        if analysis.syntax_ok:
            lines = ["- Syntax: OK"]
        else:
            lines = [f"- Syntax: ERROR ({analysis.syntax_message})"]
            if analysis.syntax_line is not None:
                lines.append(f"- SyntaxError at line {analysis.syntax_line}, column {analysis.syntax_col}")
        if not cases:
            lines.append("- Tests: no test cases found")
        elif not analysis.syntax_ok:
            lines.append(f"- Tests: not run (syntax error); 0/{len(cases)} passed")
        else:
            passed = sum(r.passed for r in results)
            lines.append(f"- Tests: {passed}/{len(results)} passed")
            for r in results:
                if not r.passed:
                    case = " ".join(r.case.split())
                    lines.append(f"- Failed case: {case} -> {r.error_type}: {r.error_message or ''}".rstrip())
        return lines

    # level_passed / passed ----------------------------------------------------------------
    def _signals(self, ctx: dict, aux_text: str, main_text: str) -> list[str]:
        """Short follow-ups (docs/multiturn.md §5.1): the optional first-turn prompt, the agent's previous code,
        then either the ``level_passed`` signals (implementation, syntax, tests, and aux usage for main) or
        the single ``passed`` signal (syntax OK, main defined, and every test passed), then "Revise ..."."""
        entry = ctx["entry_point"]
        analysis = analyze(aux_text, main_text, entry, ctx["prompt"])
        cases, results = self._run_tests(ctx, analysis)
        total, passed = len(cases), sum(r.passed for r in results)
        if self.mode == "passed":
            ok = analysis.syntax_ok and analysis.main_ok and 0 < total == passed
            signal = "All levels passed" if ok else "Not all levels passed"
            tail = {role: [f"Signal: {signal}", ""] for role in ("aux", "main")}
            verb = "if needed"
        else:
            tests = ("No tests found" if total == 0 else "Passed all tests" if passed == total
                     else "No tests passed" if passed == 0 else f"Passed {passed}/{total} tests")
            syntax = "Syntax correct" if analysis.syntax_ok else "Syntax not correct"
            if not analysis.main_ok:
                usage = "Main missing; cannot check aux usage"
            elif not analysis.calls_aux:
                usage = "Main does not call aux"
            elif analysis.ignored_aux_calls:
                usage = "Aux called but result not used properly"
            else:
                usage = "Aux call present and used"
            tail = {}
            for role, ok in (("aux", analysis.aux_ok), ("main", analysis.main_ok)):
                impl = "OK" if ok else "No implementation found in required structure"
                tail[role] = ["Signals:", f"- Implementation: {impl}", f"- Syntax: {syntax}", f"- Tests: {tests}"]
                tail[role] += [f"- Aux usage: {usage}", ""] if role == "main" else [""]
            verb = "accordingly"
        out = []
        for role, src in (("aux", analysis.aux_src), ("main", analysis.main_src)):
            lines = []
            if self.original_prompt_flag and entry:
                item = {"prompt": ctx["prompt"], "entry_point": entry}
                lines += [aux_prompt(item) if role == "aux" else main_prompt(item), ""]
            if self.previous_response_flag:
                label = f"{AUX_NAME}(...)" if role == "aux" else "main"
                lines += [f"Your previous {label} implementation:", src or "<no implementation found>", ""]
            lines += tail[role]
            name = AUX_NAME if role == "aux" else entry or "main"
            lines.append(f"Revise your {name}(...) {verb}. Output ONLY the function code.")
            out.append("\n".join(lines))
        return out

    # expert_edits -------------------------------------------------------------------------
    def _expert_edits(self, ctx: dict, aux_text: str, main_text: str) -> list[str]:
        entry = ctx["entry_point"] or "main"
        analysis = analyze(aux_text, main_text, entry, ctx["prompt"])
        edits = self._ask_expert(ctx["prompt"], entry, analysis.combined)
        out = []
        for role in ("aux", "main"):
            feedback = edits[role]
            if ctx["entry_point"]:
                item = {"prompt": ctx["prompt"], "entry_point": ctx["entry_point"]}
                text = aux_prompt(item) if role == "aux" else main_prompt(item)
            else:
                text = ctx["prompt"]
            if self.previous_response_flag:  # the agent sees what it wrote, as in plain mode
                src = analysis.aux_src if role == "aux" else analysis.main_src
                label = f"{AUX_NAME}(...)" if role == "aux" else f"{entry}(...)"
                text += f"\n\nYour previous {label} implementation:\n{src or '<no implementation found>'}"
            if feedback:
                text += "\n\nHere is the feedback from an expert:\n" + feedback
            out.append(text)
        return out

    def _ask_expert(self, problem: str, entry: str, combined: str) -> dict[str, str]:
        messages = [
            {"role": "system", "content": "You are an expert Python reviewer. Reply with one JSON object."},
            {
                "role": "user",
                "content": (
                    "Two programmers solve this problem together. One writes a helper "
                    f"`{AUX_NAME}(...)`, the other writes `{entry}(...)`, which may call the helper."
                    f"\n\nProblem:\n{problem.strip()}\n\n"
                    f"Their combined code:\n```python\n{combined or '# (no code found)'}\n```\n\n"
                    'Return JSON with exactly two string keys, "aux" and "main": for each function, the '
                    "concrete edits it needs (or a minimal correct implementation). If a function needs no "
                    f'change, use the text "{NO_CHANGES}".'
                ),
            },
        ]
        for attempt in range(1, self.max_retries + 1):
            try:
                edits = parse_expert_edits(self.client(messages))
            except Exception as exc:  # noqa: BLE001 - any client failure: retry like a malformed answer
                log.warning("expert_edits: attempt %d/%d failed: %s", attempt, self.max_retries, exc)
                continue
            if edits is not None:
                return edits
            log.warning(
                "expert_edits: attempt %d/%d returned no JSON with aux/main", attempt, self.max_retries
            )
        log.warning(
            "expert_edits: no usable expert answer after %d attempts; using empty edits", self.max_retries
        )
        return {"aux": "", "main": ""}


def _history_section(agent, role, prompt_history, response_history) -> list[str]:
    lines = []
    prompts = list(prompt_history[agent]) if prompt_history and len(prompt_history) > agent else []
    responses = list(response_history[agent]) if response_history and len(response_history) > agent else []
    if prompts:
        lines.append("History: previous prompts")
        for t, text in enumerate(prompts, 1):
            lines += [f"- Turn {t} prompt:", str(text)]
    if responses:
        lines.append(f"History: your previous {role} responses")
        for t, text in enumerate(responses, 1):
            lines += [f"- Turn {t} response:", str(text)]
    if lines:
        lines.append("")
    return lines


def _aux_usage_lines(analysis: CodeAnalysis) -> list[str]:
    entry = analysis.entry_point
    if not analysis.calls_aux:
        lines = [f"- Aux usage: {entry} does NOT call {AUX_NAME}(...)"]
    elif analysis.ignored_aux_calls:
        shown = "; ".join(analysis.ignored_aux_calls[:2])
        lines = [f"- Aux usage: {entry} calls {AUX_NAME}(...) but misuses it (result ignored: {shown})"]
    else:
        lines = [f"- Aux usage: {entry} calls {AUX_NAME}(...) and uses its result"]
    if analysis.calls_aux and analysis.thin_wrapper:
        lines.append(
            f"- Warning: {entry} is a thin wrapper around {AUX_NAME}(...); add real logic of its own."
        )
    return lines


#: CoMLRL's ``external.*`` config keys that are named differently here
_EXTERNAL_KEYS = {"original_prompt": "original_prompt_flag", "previous_response": "previous_response_flag"}


def external_options(external: Mapping) -> dict:
    """:func:`make_code_transition` options from CoMLRL's ``external`` config section (``mode``,
    ``sandbox_slice``, ``original_prompt``, ``previous_response``, ``expert_model``, ...)."""
    return {_EXTERNAL_KEYS.get(k, k): v for k, v in dict(external).items()}


def make_code_transition(mode: str = "level_feedback", **options) -> CodeTransition:
    """Build the code environment's external transition; see :class:`CodeTransition` for options."""
    return CodeTransition(mode, **options)
