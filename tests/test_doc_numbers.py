"""Numbers the docs state about a run's result are checked against a fresh run, so they cannot go stale.

* README's Quick start: the default job (``comlrl-lightning fit --config configs/madpo/tiny.yaml``, as shipped)
  prints its task reward before and after training; README quotes both, and the config's header its update count.
* Config headers state no timing (it depends on the machine and its load; README's Quick start gives the
  conditions of its own figure).
The notebook's committed outputs are checked against a fresh run by tests/test_notebook.py.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
QUICKSTART_CONFIG = ROOT / "configs" / "madpo" / "tiny.yaml"


def readme_quickstart_rewards() -> tuple[float, float]:
    """The (before, after) task reward README's Quick start quotes for the default job."""
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"before and after training \((\d+\.\d+) → (\d+\.\d+)", section)
    assert found, "README's Quick start no longer quotes the default job's reward as '(before → after'"
    return float(found.group(1)), float(found.group(2))


def header_updates(config: Path) -> int:
    found = re.search(r"(\d+) updates", config.read_text().split("\n", 1)[0])
    assert found, f"{config.name}'s first line no longer gives its update count"
    return int(found.group(1))


def test_readme_and_header_quote_numbers_this_test_can_read():
    before, after = readme_quickstart_rewards()
    assert 0 < before < after
    assert header_updates(QUICKSTART_CONFIG) > 0


@pytest.mark.slow
def test_quickstart_default_job_prints_the_numbers_readme_quotes(tmp_path, monkeypatch, capsys):
    """The Quick start job exactly as shipped (only the working directory is a temporary one): README's
    "before → after" is what it prints, to README's 3 decimals, and its header's update count is what it runs."""
    from comlrl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(QUICKSTART_CONFIG), "--trainer.enable_progress_bar=false"])
    printed = re.search(r"task reward \(eval/reward_mean\): before (\d+\.\d+) -> after (\d+\.\d+)",
                        capsys.readouterr().out)
    assert printed, "the default job no longer prints its before/after task reward"
    before, after = float(printed.group(1)), float(printed.group(2))
    assert (f"{before:.3f}", f"{after:.3f}") == tuple(f"{v:.3f}" for v in readme_quickstart_rewards()), (
        f"README's Quick start is stale: the default job printed {before:.4f} -> {after:.4f}")
    with open(tmp_path / "outputs" / "madpo_tiny" / "lightning_logs" / "version_0" / "metrics.csv") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f) if r.get("eval/reward_mean")]
    assert steps[-1] == header_updates(QUICKSTART_CONFIG)  # the last evaluation runs after the last update


def test_config_headers_state_no_timing():
    """Timing depends on the machine and its load, so config headers do not promise one."""
    timing = re.compile(r"CPU-seconds|CPU-s\b|\bseconds\b|\bminutes?\b|\bhours?\b|\bwall\b", re.IGNORECASE)
    claims = []
    for config in sorted((ROOT / "configs").rglob("*.yaml")):
        for number, line in enumerate(config.read_text().splitlines(), 1):
            comment = line.split("#", 1)[1] if "#" in line else ""
            if timing.search(comment):
                claims.append(f"{config.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not claims, "\n".join(claims)
