"""examples/: CoMLRL-style scripts, one per trainer family, that run on the embedded tiny model and import only
CoMLRL's public names under the comlrl_lightning prefix (docs/coming-from-comlrl.md)."""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "trainers"))
from test_comlrl_imports import COMLRL_EXPORTS  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = sorted(p for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


def test_one_script_per_trainer_family():
    assert {p.stem for p in SCRIPTS} == {"madpo", "madpo_iter", "marlhf", "magrpo", "actor_critic"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_imports_are_comlrls_with_our_prefix(script):
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("comlrl_lightning"):
            upstream = node.module.replace("comlrl_lightning", "comlrl", 1)
            assert upstream in COMLRL_EXPORTS, f"{script.name}: {node.module} is not a CoMLRL module path"
            for alias in node.names:
                assert alias.name in COMLRL_EXPORTS[upstream], f"{script.name}: {alias.name} not in {upstream}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_example_runs_on_the_tiny_model(script, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    runpy.run_path(str(script), run_name="__main__")
