"""Static analysis of the two agents' code (docs/multiturn.md §5.1): extraction, definitions, syntax,
aux usage. Pure functions on strings; nothing here executes model code.

Agent 0 ("aux") writes a helper ``aux(...)``; agent 1 ("main") writes the entry-point function,
which may call ``aux``. The combined program is: import lines of the original prompt, then import
lines written at top level in the completions (an addition to upstream, which drops them), then
``aux``, then the entry point, joined by blank lines.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from comlrl_lightning.envs.code.cases import parse_python

AUX_NAME = "aux"

_FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)
_DEF = re.compile(r"^(\s*)(?:async\s+)?def\s+(\w+)\s*\(")
_IMPORT = re.compile(
    r"^(?:from\s+[\w.]+\s+import\s+.+|import\s+[\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*)$"
)


def strip_fences(text: str) -> str:
    """The code inside markdown fences (all fenced blocks, joined), or the text without stray fences."""
    if not isinstance(text, str):
        return ""
    if "```" not in text:
        return text
    blocks = _FENCE.findall(text)
    return "\n\n".join(blocks) if blocks else text.replace("```", "")


def _def_blocks(text: str) -> list[tuple[str, str]]:
    """(name, dedented source) of every ``def`` block, by indentation; works on broken code too."""
    lines = strip_fences(text).splitlines()
    blocks: list[tuple[str, str]] = []
    i = 0
    while i < len(lines):
        match = _DEF.match(lines[i])
        if not match:
            i += 1
            continue
        indent, name = len(match.group(1).expandtabs()), match.group(2)
        block = [lines[i]]
        depth = _paren_delta(lines[i])
        i += 1
        while i < len(lines):
            line = lines[i]
            stripped = line.strip()
            line_indent = len(line) - len(line.lstrip()) if stripped else None
            if depth > 0 or not stripped or line_indent > indent:
                block.append(line)
                depth = max(0, depth + _paren_delta(line))
                i += 1
            else:
                break
        while block and not block[-1].strip():
            block.pop()
        blocks.append((name, "\n".join(_strip_indent(line, indent) for line in block)))
    return blocks


def _strip_indent(line: str, indent: int) -> str:
    line = line.expandtabs()
    return line[indent:] if not line[:indent].strip() else line.lstrip()


def _paren_delta(line: str) -> int:
    code = line.split("#", 1)[0]
    return sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")


def clean_completion(text: str) -> str:
    """Remove markdown fences and keep only the ``def`` blocks, joined by blank lines."""
    return "\n\n".join(src for _, src in _def_blocks(text))


def extract_function(text: str, name: str) -> str:
    """Source of the first function called `name` in a completion (dedented), or ``""``."""
    if not text or not name:
        return ""
    for block_name, src in _def_blocks(text):
        if block_name == name:
            return src
    return ""


def import_lines(text: str) -> list[str]:
    """Import statements on their own line (stripped, de-duplicated, in order)."""
    found = []
    for line in strip_fences(text or "").splitlines():
        stripped = line.strip()
        if _IMPORT.match(stripped):
            found.append(stripped)
    return list(dict.fromkeys(found))


def top_level_imports(text: str) -> list[str]:
    """Import lines written at column 0 of a completion (outside any function)."""
    lines = strip_fences(text or "").splitlines()
    return import_lines("\n".join(line for line in lines if line[:1] not in (" ", "\t")))


def combine_code(aux_src: str, main_src: str, imports: list[str] | str = ()) -> str:
    """Imports, then aux, then main, joined by blank lines (empty parts left out)."""
    if isinstance(imports, str):
        imports = [imports] if imports.strip() else []
    parts = ["\n".join(dict.fromkeys(imports))] if imports else []
    parts += [p for p in (aux_src, main_src) if p and p.strip()]
    return "\n\n".join(parts)


def _parse_function(src: str) -> ast.FunctionDef | None:
    try:
        tree = parse_python(src)
    except (SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


def _own_nodes(func: ast.AST):
    """Nodes of a function body, not descending into nested functions, lambdas or classes."""
    stack = list(ast.iter_child_nodes(func))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def has_return(src: str) -> bool:
    func = _parse_function(src)
    if func is None:
        return re.search(r"\breturn\b", src) is not None
    return any(isinstance(n, ast.Return) for n in _own_nodes(func))


def check_definition(src: str, description: str) -> tuple[bool, str]:
    """(ok, message): defined and contains a return statement."""
    if not src:
        return False, f"{description} not defined"
    if not has_return(src):
        return False, f"{description} missing return statement"
    return True, f"{description} defined with a return statement"


def _is_aux_call(node: ast.AST, aux_name: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == aux_name


def binds_name(func: ast.AST, name: str) -> bool:
    """Whether `name` is bound anywhere inside `func` (a parameter, default arguments included, an assignment, an
    import, a nested ``def``/``class``, ``except ... as``, ``global``/``nonlocal``, a pattern), so that a call
    ``name(...)`` there may not reach the module-level function of that name."""
    for node in ast.walk(func):
        if node is func:
            continue
        if isinstance(node, ast.arg) and node.arg == name:
            return True
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, (ast.Store, ast.Del)):
            return True
        if isinstance(node, ast.alias) and (node.asname or node.name.split(".")[0]) == name:
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler)) \
                and node.name == name:
            return True
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return True
        if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name == name:
            return True
    return False


def calls_aux(main_src: str, aux_name: str = AUX_NAME) -> bool:
    """Whether the main function calls the team's ``aux(...)``: a call by that name, with ``aux`` not rebound
    inside main (a parameter ``aux=lambda ...``, a local ``aux = ...``, an import or nested ``def`` of that name,
    ``global aux``): such a main calls a function of its own, not agent 0's, and earns no cooperation terms."""
    if not main_src:
        return False
    func = _parse_function(main_src)
    if func is None:
        return re.search(rf"\b{re.escape(aux_name)}\s*\(", main_src) is not None
    if binds_name(func, aux_name):
        return False
    return any(_is_aux_call(n, aux_name) for n in ast.walk(func))


def ignored_aux_calls(main_src: str, aux_name: str = AUX_NAME) -> list[str]:
    """``"Line n: <code>"`` for each statement that calls aux and throws its result away."""
    if not main_src:
        return []
    lines = main_src.splitlines()
    func = _parse_function(main_src)
    if func is None:
        pattern = re.compile(rf"^{re.escape(aux_name)}\s*\(.*\)\s*;?$")
        return [f"Line {n}: {ln.strip()}" for n, ln in enumerate(lines, 1) if pattern.match(ln.strip())]
    found = [
        node.lineno
        for node in ast.walk(func)
        if isinstance(node, ast.Expr) and _is_aux_call(node.value, aux_name)
    ]
    return [f"Line {n}: {lines[n - 1].strip()}" for n in sorted(found)]


def is_thin_wrapper(main_src: str, aux_name: str = AUX_NAME) -> bool:
    """True when the body (docstring and ``pass`` aside) is empty, ``return aux(...)``, or
    ``x = aux(...)`` followed by ``return x``."""
    func = _parse_function(main_src)
    if func is None:
        return False
    body = [
        s
        for s in func.body
        if not isinstance(s, ast.Pass)
        and not (
            isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)
        )
    ]
    if not body:
        return True
    if len(body) == 1:
        return isinstance(body[0], ast.Return) and _is_aux_call(body[0].value, aux_name)
    if len(body) == 2 and isinstance(body[1], ast.Return) and isinstance(body[1].value, ast.Name):
        first, name = body[0], body[1].value.id
        if isinstance(first, ast.Assign) and len(first.targets) == 1:
            target, value = first.targets[0], first.value
        elif isinstance(first, ast.AnnAssign):
            target, value = first.target, first.value
        else:
            return False
        return isinstance(target, ast.Name) and target.id == name and _is_aux_call(value, aux_name)
    return False


@dataclass
class CodeAnalysis:
    """Everything the reward and the feedback prompts need to know about one aux/main pair."""

    entry_point: str
    aux_src: str
    main_src: str
    aux_ok: bool
    aux_message: str
    main_ok: bool
    main_message: str
    imports: list[str]
    combined: str
    syntax_ok: bool
    syntax_message: str
    syntax_line: int | None = None
    syntax_col: int | None = None
    calls_aux: bool = False
    ignored_aux_calls: list[str] = field(default_factory=list)
    thin_wrapper: bool = False


def analyze(aux_completion: str, main_completion: str, entry_point: str, prompt: str = "") -> CodeAnalysis:
    """Extract ``aux`` from agent 0 and `entry_point` from agent 1, then run the static checks."""
    aux_src = extract_function(aux_completion, AUX_NAME)
    main_src = extract_function(main_completion, entry_point)
    aux_ok, aux_message = check_definition(aux_src, "aux function")
    main_ok, main_message = check_definition(main_src, f"main function ({entry_point})")
    imports = list(
        dict.fromkeys(
            import_lines(prompt) + top_level_imports(aux_completion) + top_level_imports(main_completion)
        )
    )
    combined = combine_code(aux_src, main_src, imports)
    line = col = None
    try:
        parse_python(combined)
        syntax_ok, syntax_message = True, "syntax OK"
    except SyntaxError as exc:
        syntax_ok, syntax_message = False, f"syntax error: {exc.msg}"
        line, col = exc.lineno, exc.offset
    except ValueError as exc:  # e.g. null bytes
        syntax_ok, syntax_message = False, f"syntax error: {exc}"
    return CodeAnalysis(
        entry_point=entry_point,
        aux_src=aux_src,
        main_src=main_src,
        aux_ok=aux_ok,
        aux_message=aux_message,
        main_ok=main_ok,
        main_message=main_message,
        imports=imports,
        combined=combined,
        syntax_ok=syntax_ok,
        syntax_message=syntax_message,
        syntax_line=line,
        syntax_col=col,
        calls_aux=calls_aux(main_src),
        ignored_aux_calls=ignored_aux_calls(main_src),
        thin_wrapper=is_thin_wrapper(main_src) if main_src else False,
    )
