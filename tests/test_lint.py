"""The code base is ruff-clean under the rules in pyproject.toml."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    if shutil.which("ruff") is None and subprocess.run([sys.executable, "-m", "ruff", "--version"],
                                                      capture_output=True).returncode != 0:
        pytest.skip("ruff is not installed (pip install -e .[dev])")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "comlrl_lightning", "callbacks", "tests", "benchmarks", "examples"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
