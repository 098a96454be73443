"""Per-agent formatters of the code environment (agent 0 writes ``aux``, agent 1 the entry point).

Both follow the library's formatter protocol (docs/multiturn.md §7.1): ``formatter(item,
external_prompts=None) -> str``. At turn 0 they build the instruction from the item's
``prompt`` and ``entry_point``. When an external transition supplies a follow-up prompt
(``external_prompts``), they return it unchanged: the transitions of this package already write
complete prompts, and re-wrapping feedback text as a "problem" is the upstream pitfall of docs/multiturn.md §5.1.
Where upstream answers "Error: Could not extract function information from prompt." (no
``def <entry_point>(...)`` in the prompt), these formatters use the signature ``def name(...)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from comlrl_lightning.envs.code.analysis import AUX_NAME


def _field(item: Mapping, key: str) -> str:
    value = item.get(key) if isinstance(item, Mapping) else None
    if not isinstance(value, str) or not value.strip():
        task = item.get("task_id", "<no task_id>") if isinstance(item, Mapping) else repr(item)[:60]
        raise ValueError(f"code task item {task!r} needs a non-empty string field {key!r}")
    return value


def function_signature(prompt: str, entry_point: str) -> str:
    """``def name(params)`` as declared in the prompt (annotations kept, return type dropped);
    ``def name(...)`` when the prompt does not declare it."""
    match = re.search(rf"def\s+{re.escape(entry_point)}\s*\((.*?)\)\s*(?:->[^:]*)?:", prompt, re.DOTALL)
    if not match:
        return f"def {entry_point}(...)"
    params = " ".join(match.group(1).split())
    return f"def {entry_point}({params})"


def aux_prompt(item: Mapping) -> str:
    """Turn-0 instruction for agent 0 (the helper writer)."""
    prompt, entry = _field(item, "prompt"), _field(item, "entry_point")
    return (
        "You write Python as part of a team of two. Your teammate will implement "
        f"`{function_signature(prompt, entry)}` and may call one helper function that you provide.\n\n"
        f"Problem:\n{prompt.strip()}\n\n"
        f"Create a helper function named `{AUX_NAME}` that solves a useful sub-problem of this task.\n"
        "Rules:\n"
        f"- define exactly one function, `def {AUX_NAME}(...)`, choosing its parameters yourself;\n"
        "- it must return its result (do not print it);\n"
        f"- do not implement `{entry}` itself;\n"
        "- output ONLY the function code, no explanations and no tests."
    )


def main_prompt(item: Mapping) -> str:
    """Turn-0 instruction for agent 1 (the entry-point writer)."""
    prompt, entry = _field(item, "prompt"), _field(item, "entry_point")
    signature = function_signature(prompt, entry)
    return (
        f"Solve this coding problem in Python by implementing `{signature}`.\n\n"
        f"Problem:\n{prompt.strip()}\n\n"
        f"Your teammate provides a helper function `{AUX_NAME}(...)` that you can call. "
        "Use it where it helps, and use its return value.\n"
        "Rules:\n"
        f"- define `{signature}:` exactly;\n"
        f"- do not define `{AUX_NAME}` yourself;\n"
        "- output ONLY the function code, no explanations and no tests."
    )


def aux_formatter(item: Mapping, external_prompts: str | None = None) -> str:
    """Formatter of agent 0: the turn-0 aux instruction, or the transition's prompt verbatim."""
    return external_prompts if external_prompts is not None else aux_prompt(item)


def main_formatter(item: Mapping, external_prompts: str | None = None) -> str:
    """Formatter of agent 1: the turn-0 main instruction, or the transition's prompt verbatim."""
    return external_prompts if external_prompts is not None else main_prompt(item)


FORMATTERS = (aux_formatter, main_formatter)
"""Pass as ``formatters=`` (one per agent, aux first)."""
