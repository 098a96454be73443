"""``fit --config <the run's saved config.yaml>`` reproduces the run, for every config under configs/.

Each config runs a short fit (1 batch, 4 new tokens); its saved ``config.yaml`` is then fed back to ``fit`` in
another folder, and both runs' ``metrics.csv`` must be identical, row for row. MADPO's two configs are replayed
by ``test_cli_user_day.py`` (the default job and the iterative run past round 0)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml
from fake_llm_server import FakeLLMServer

ROOT = Path(__file__).resolve().parents[2]
ALL = sorted(str(p.relative_to(ROOT / "configs")) for p in (ROOT / "configs").rglob("*.yaml"))
ELSEWHERE = {"madpo/tiny.yaml", "madpo/iterative_tiny.yaml"}  # test_cli_user_day.py
SHORT = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.max_epochs=1",
         "--trainer.limit_train_batches=1"]
SMALL_ARGS = {"max_new_tokens": 4, "eval_num_samples": 1}
SMALL_PREFERENCES = {"preference_num_candidates": 4, "preference_pairs_per_sample": 2, "reward_num_train_epochs": 1}


def _overrides(name: str) -> list[str]:
    if name.startswith("reward_model/"):
        return ["--trainer.limit_val_batches=1"]
    args = dict(SMALL_ARGS, **(SMALL_PREFERENCES if name.startswith("marlhf/") else {}))
    return [f"--model.init_args.args.{k}={v}" for k, v in args.items()]


def _rows(run: Path) -> list[dict]:
    with open(run / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_every_config_is_replayed_somewhere():
    assert set(ALL) >= ELSEWHERE and len(ALL) >= 12


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.sandbox) if n.startswith("magrpo/code_") else n
                                  for n in sorted(set(ALL) - ELSEWHERE)])  # the code environment needs bubblewrap
def test_saved_config_reproduces_the_run(name, tmp_path, monkeypatch):
    from comlrl_lightning.cli import main

    if "expert" in name:  # the expert is an OpenAI-compatible server: a loopback fake, its key from the environment
        server = FakeLLMServer().start()
        monkeypatch.setenv("EXPERT_API_URL", server.url("openai"))
        monkeypatch.setenv("EXPERT_API_KEY", "sk-replay-test-0123456789")
    save_dir = yaml.safe_load((ROOT / "configs" / name).read_text())["trainer"]["logger"]["init_args"]["save_dir"]
    runs = []
    for folder, config, extra in (("a", ROOT / "configs" / name, SHORT + _overrides(name)), ("b", None, [])):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        main(["fit", "--config", str(config or runs[0] / "config.yaml"), *extra])
        runs.append(tmp_path / folder / save_dir / "lightning_logs" / "version_0")
    saved = (runs[0] / "config.yaml").read_text()
    assert "Unable to serialize" not in saved and "sk-replay-test" not in saved
    first, again = _rows(runs[0]), _rows(runs[1])
    assert first and again == first
    if "expert" in name:
        assert server.requests  # the expert was asked in both runs
        server.stop()
