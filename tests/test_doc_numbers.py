"""Numbers the docs state about a run's result are checked against a fresh run, so they cannot go stale.

* README's Quick start: the default job (``comlrl-lightning fit --config configs/madpo/tiny.yaml``, as shipped)
  prints its task reward before and after training; README quotes both, and the config's header its update count.
* Config headers state no timing (it depends on the machine and its load; README's Quick start gives the
  conditions of its own figure).
The notebook's committed outputs are checked against a fresh run by tests/test_notebook.py.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
QUICKSTART_CONFIG = ROOT / "configs" / "madpo" / "tiny.yaml"


def readme_quickstart_rewards() -> tuple[float, float, float]:
    """The (before, after, tolerance of after) task reward README's Quick start quotes for the default job."""
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"before and after training \((\d+\.\d+) → (\d+\.\d+) ± (\d+\.\d+)", section)
    assert found, "README's Quick start no longer quotes the default job's reward as '(before → after ± tolerance'"
    return float(found.group(1)), float(found.group(2)), float(found.group(3))


def header_updates(config: Path) -> int:
    found = re.search(r"(\d+) updates", config.read_text().split("\n", 1)[0])
    assert found, f"{config.name}'s first line no longer gives its update count"
    return int(found.group(1))


def test_readme_and_header_quote_numbers_this_test_can_read():
    before, after, tolerance = readme_quickstart_rewards()
    assert 0 < before < after - tolerance and tolerance <= 0.1
    assert header_updates(QUICKSTART_CONFIG) > 0


@pytest.mark.slow
def test_quickstart_default_job_prints_the_numbers_readme_quotes(tmp_path):
    """The Quick start job exactly as shipped, in a process of its own as a user starts it (an in-process run would
    inherit the torch thread count earlier tests set; only the working directory is a temporary one): the "before"
    README quotes is what it prints, to 3 decimals (the untrained model's evaluation), the "after" lies within
    README's stated tolerance (training amplifies the float rounding of the CPU and its thread count), and its
    header's update count is what it runs."""
    proc = subprocess.run([sys.executable, "-m", "comlrl_lightning", "fit", "--config", str(QUICKSTART_CONFIG),
                           "--trainer.enable_progress_bar=false"], cwd=tmp_path, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    printed = re.search(r"task reward \(eval/reward_mean\): before (\d+\.\d+) -> after (\d+\.\d+)", proc.stdout)
    assert printed, "the default job no longer prints its before/after task reward"
    before, after = float(printed.group(1)), float(printed.group(2))
    quoted_before, quoted_after, tolerance = readme_quickstart_rewards()
    assert f"{before:.3f}" == f"{quoted_before:.3f}", f"README's Quick start is stale: the run began at {before:.4f}"
    assert abs(after - quoted_after) <= tolerance, (
        f"README's Quick start is stale: the default job ended at {after:.4f}, README says {quoted_after} ± {tolerance}")
    with open(tmp_path / "outputs" / "madpo_tiny" / "lightning_logs" / "version_0" / "metrics.csv") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f) if r.get("eval/reward_mean")]
    assert steps[-1] == header_updates(QUICKSTART_CONFIG)  # the last evaluation runs after the last update
