"""The cheapest shipped learning configs learn when run through the CLI exactly as shipped (only the seed and the
output folder overridden), on 2 seeds: benchmarks/configs_learn.py's ``run_config``, the function behind the
config learning benchmark (benchmarks/README.md, "configs_learn.py"; every config on seeds 0-9 there).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location(
    "benchmark_configs_learn", Path(__file__).resolve().parents[2] / "benchmarks" / "configs_learn.py")
configs_learn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(configs_learn)

# the cheapest learning configs (benchmarks/README.md, "configs_learn.py", column s / run)
CHEAP = ["reward_model/tiny", "magrpo/tiny", "marlhf/tiny"]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", CHEAP)
def test_shipped_config_learns(tmp_path, monkeypatch, name, seed):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = configs_learn.run_config(name, seed, tmp_path)
    print(f"{name} seed {seed}: {r['metric']} {r['before']:.3f} -> {r['after']:.3f} ({r['seconds']:.0f} s)")
    assert r["gain"] > configs_learn.MARGINS[name], r


def test_unknown_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="config='magrpo/code_plain_tiny' is not a learning config"):
        configs_learn.run_config("magrpo/code_plain_tiny", 0, tmp_path)


def test_every_config_is_benchmarked_or_excluded():
    """A new config under configs/ must be added to the benchmark (MARGINS) or to its exclusions."""
    root = Path(configs_learn.__file__).resolve().parents[1] / "configs"
    tiny = {str(p.relative_to(root).with_suffix("")) for p in root.rglob("*tiny*.yaml")}
    assert tiny <= set(configs_learn.MARGINS) | set(configs_learn.EXCLUDED)
    assert set(configs_learn.MARGINS) <= tiny
