"""HumanEval test code -> standalone test cases for the sandbox (docs/multiturn.md §5.1).

:func:`extract_test_cases` turns the asserts of ``check(candidate)`` into one case each and
:func:`test_setup_code` keeps what the cases need from the rest of the test module. Pure parsing with
``ast``: nothing here runs code (that is :mod:`comlrl_lightning.envs.code.sandbox`, which re-exports both).
"""

from __future__ import annotations

import ast
import re
import threading

# CPython 3.11's AST constructor keeps a per-interpreter recursion counter that is not thread-safe: parsing from
# several threads at once (the sandbox and the code reward run tests in thread pools) can fail with "AST
# constructor recursion depth mismatch". Every parse of ours goes through this lock.
_AST_LOCK = threading.Lock()


def parse_python(source: str) -> ast.Module:
    """``ast.parse(source)``, serialised across threads (see ``_AST_LOCK``)."""
    with _AST_LOCK:
        return ast.parse(source)


def unparse_python(node: ast.AST) -> str:
    """``ast.unparse(node)``, serialised across threads."""
    with _AST_LOCK:
        return ast.unparse(node)

__all__ = ["extract_test_cases", "prompt_helpers", "test_setup_code"]


def _check_function(tree: ast.Module) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            return node
    return None


def _mentions(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def _has_nested_asserts(check: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(check))


def extract_test_cases(test_code: str, entry_point: str) -> list[str]:
    """Split a HumanEval ``check(candidate)`` into standalone assert statements.

    Each assert directly inside ``check`` that mentions ``candidate`` becomes one case, with
    ``candidate`` renamed to ``entry_point``; duplicates are dropped, order is kept. Multi-line
    asserts are supported. If ``check`` exists but has no such top-level assert (e.g. asserts inside
    a loop), the whole check becomes a single case ``check(<entry_point>)`` so no test is lost.
    A ``check`` without any assert gives no case.
    Unparseable test code falls back to the line rule of the spec (stripped lines inside ``check``
    that start with ``assert`` and contain ``candidate``).
    """
    if not test_code or not entry_point:
        return []
    rename = re.compile(r"\bcandidate\b")
    cases: list[str] = []
    try:
        tree = parse_python(test_code)
    except SyntaxError:
        inside = False
        for line in test_code.splitlines():
            if re.match(r"\s*def\s+check\s*\(", line):
                inside = True
            elif inside:
                stripped = line.strip()
                if stripped.startswith("assert") and "candidate" in stripped:
                    cases.append(rename.sub(entry_point, stripped))
        return list(dict.fromkeys(cases))
    check = _check_function(tree)
    if check is None:
        return []
    for node in check.body:
        if isinstance(node, ast.Assert) and _mentions(node, "candidate"):
            source = ast.get_source_segment(test_code, node) or unparse_python(node)
            cases.append(rename.sub(entry_point, source))
    if not cases and _has_nested_asserts(check):
        cases.append(f"check({entry_point})")
    return list(dict.fromkeys(cases))


def test_setup_code(test_code: str) -> str:
    """Module-level statements of the test code other than ``def check`` (imports, constants,
    helpers), run after the solution so that cases can use them. ``METADATA`` is harmless."""
    try:
        tree = parse_python(test_code or "")
    except SyntaxError:
        return ""
    keep = [node for node in tree.body if not (isinstance(node, ast.FunctionDef) and node.name == "check")]
    # `check` itself is kept only when a case calls it (fallback of extract_test_cases).
    check = _check_function(tree)
    if (
        check is not None
        and _has_nested_asserts(check)
        and not any(isinstance(n, ast.Assert) and _mentions(n, "candidate") for n in check.body)
    ):
        keep.append(check)
    keep.sort(key=lambda n: n.lineno)
    return "\n".join(ast.get_source_segment(test_code, n) or unparse_python(n) for n in keep)


test_setup_code.__test__ = False  # type: ignore[attr-defined]


_HELPER_NODES = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
                 ast.AnnAssign)


def prompt_helpers(prompt: str, entry_point: str | None) -> str:
    """The problem prompt's own top-level definitions (imports, helper functions such as HumanEval's
    ``encode_shift`` or ``poly``, classes, constants), without the entry point: the trusted versions that a test
    calls. The sandbox runs them on the judge's side, so a model that redefines a helper (an identity
    ``encode_shift``) changes only its own copy. A prompt that does not parse gives ``""``."""
    if not prompt or not prompt.strip():
        return ""
    try:
        tree = parse_python(prompt)
    except (SyntaxError, ValueError):
        return ""
    keep = [
        node for node in tree.body
        if isinstance(node, _HELPER_NODES)
        and not (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point)
    ]
    parts = []
    for node in keep:
        source = (None if getattr(node, "decorator_list", None) else ast.get_source_segment(prompt, node)) or \
            unparse_python(node)
        if isinstance(node, (ast.Import, ast.ImportFrom)):  # a module the judge lacks fails no test by itself
            source = f"try:\n    {source}\nexcept ImportError:\n    pass"
        parts.append(source)
    return "\n".join(parts)
