"""Learning tests: MARLHF and MARLHFIter (magrpo backend) raise the task reward of the built-in cooperative task.

The recipes are benchmarks/recipes.py's (one definition for these tests and `benchmarks/learning.py`), run on
three seeds each. Evaluation: the 8 held-out items, 8 sampled joint responses each, fixed evaluation streams.
The reward model is the tiny configs' length-only head (``reward_length_features="only"``,
docs/preference.md §8.2): the task's reward is a ratio of character counts, which the tiny backbone cannot read.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location(
    "benchmark_recipes", Path(__file__).resolve().parents[2] / "benchmarks" / "recipes.py")
recipes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recipes)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("family", ["marlhf", "marlhf_iter"])
def test_marlhf_raises_the_task_reward(tiny_model_dir, tmp_path, family, seed):
    r = recipes.run_recipe(family, str(tiny_model_dir), seed, str(tmp_path))
    fits = r["reward_fits"]
    print(f"{family} seed {seed}: before {r['before']:.3f} after {r['after']:.3f} ({r['seconds']:.0f} s); held-out "
          f"reward-model accuracy per fit {[round(f['reward_model/val_accuracy'], 3) for f in fits]}")
    # reward_model/val_accuracy is measured at every fit (MARLHFIter: one per round)
    assert len(fits) == (2 if family == "marlhf_iter" else 1)
    assert all(0.0 <= f["reward_model/val_accuracy"] <= 1.0 for f in fits)
    # Measured with one torch thread (as here; benchmarks/learning.py, README "Learning benchmark"): before
    # 0.874 on every seed (fixed evaluation streams). Seeds 0 / 1 / 2 gain 0.509 / 0.504 / 0.517 (MARLHF) and
    # 0.503 / 0.431 / 0.520 (MARLHFIter); over seeds 0-19 the smallest gains are -0.046 (MARLHF, seed 15, the one
    # miss) and +0.316 (MARLHFIter). The 0.3 margin holds for both.
    margin = 0.3
    assert r["gain"] > margin, r
