"""Full MADPOIterTrainer rounds on the tiny model with an HTTP comparator on loopback, decentralized and
centralized; the API key never reaches logs, checkpoints or saved configs."""

from __future__ import annotations

import json
import logging

import pytest
from fake_llm_server import FakeLLMServer, http_error, rate_limited
from iterative_helpers import iter_args, make_trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from comlrl_lightning.comparators.centralized import CentralizedComparatorParseError

KEY = "sk-dummy-comparator-key-1234567890"


@pytest.fixture
def server():
    s = FakeLLMServer().start()
    yield s
    s.stop()


def _round_files(root):
    return [json.loads(p.read_text()) for p in sorted((root / "preference_replay").glob("iteration_*.json"))]


def test_openai_comparator_round_with_faults_and_no_key_leak(tiny_model_dir, tmp_path, server, monkeypatch, caplog):
    monkeypatch.setenv("CMP_KEY", KEY)
    # Comparator answers are long words: they beat or lose to the agents depending on the length ratio.
    server.texts = lambda protocol, body, i: "alpha beta gamma delta " * (1 + i % 3)
    server.enqueue(http_error(500), rate_limited(0.05))  # both survived by retries
    args = iter_args(num_iterations=1, comparator_policy="api", comparator_api_url=server.url("openai"),
                     comparator_api_format="chat", comparator_api_model="cmp-1", comparator_api_key_env="CMP_KEY",
                     comparator_api_timeout=5.0)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)
    tr = make_trainer(tiny_model_dir, tmp_path, args=args, num_items=4,
                      trainer_kwargs={"logger": CSVLogger(str(tmp_path / "logs")), "enable_checkpointing": True},
                      callbacks=[ckpt])
    with caplog.at_level(logging.DEBUG):
        tr.train()
    bodies = [r.body for r in server.requests]
    # 2 agents x 4 items, plus the two scripted failures
    assert len(bodies) == 2 * 4 + 2
    assert all(b["model"] == "cmp-1" and b["n"] == 4 for b in bodies)
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in server.requests)
    (round1,) = _round_files(tmp_path)
    assert round1["num_pairs"] > 0
    for pair in round1["pairs"]:
        assert pair["comparator_raw_reward"] is not None
        sides = pair["winner_completions"] + pair["loser_completions"]
        assert any("alpha beta gamma delta" in t for t in sides)
    # the key is nowhere on disk or in the logs
    assert KEY not in caplog.text
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in repr(tr.args) and KEY not in json.dumps(tr.args.to_dict())


def test_literal_key_is_not_saved_in_the_checkpoint_or_hparams(tiny_model_dir, tmp_path, server):
    server.texts = lambda protocol, body, i: "word " * (i + 2)
    args = iter_args(num_iterations=1, comparator_policy="api", comparator_api_url=server.url("generic"),
                     comparator_api_key=KEY)
    tr = make_trainer(tiny_model_dir, tmp_path, args=args, num_items=2,
                      trainer_kwargs={"enable_checkpointing": True, "logger": CSVLogger(str(tmp_path / "logs"))},
                      callbacks=[ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)])
    tr.train()
    assert server.requests and server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".ckpt" for p in files) and any(p.name == "hparams.yaml" for p in files)
    for path in files:
        assert KEY.encode() not in path.read_bytes(), path


def test_centralized_api_comparator_writes_all_roles_in_one_text(tiny_model_dir, tmp_path, server):
    def joint(protocol, body, i):
        return f"<agent_0>short {i}</agent_0>\n<agent_1>a much longer elaboration number {i} here</agent_1>"

    server.texts = joint
    args = iter_args(num_iterations=1, comparator_policy="api", comparator_api_url=server.url("generic"),
                     comparator_generation_mode="centralized", comparator_centralized_agent_index=1)
    tr = make_trainer(tiny_model_dir, tmp_path, args=args, num_items=3)
    tr.train()
    bodies = [r.body for r in server.requests]
    assert len(bodies) == 3  # one joint request per item, not one per agent
    assert all(b["agent_idx"] == 1 for b in bodies)
    assert all(b["prompt"].startswith("You are a centralized coordinator producing the separate outputs of 2")
               for b in bodies)
    assert "Agent 0 original prompt:" in bodies[0]["prompt"] and "<agent_1>" in bodies[0]["prompt"]
    (round1,) = _round_files(tmp_path)
    comparator_texts = {t for p in round1["pairs"] for t in p["winner_completions"] + p["loser_completions"]}
    assert any(t.startswith("short ") for t in comparator_texts)
    assert any(t.startswith("a much longer elaboration") for t in comparator_texts)
    assert not any("<agent_" in t for t in comparator_texts)  # parsed back into role texts


def test_centralized_parse_failure_names_the_raw_text(tiny_model_dir, tmp_path, server):
    server.texts = lambda protocol, body, i: "I will not use tags"
    args = iter_args(num_iterations=1, comparator_policy="api", comparator_api_url=server.url("generic"),
                     comparator_generation_mode="centralized")
    tr = make_trainer(tiny_model_dir, tmp_path, args=args, num_items=1)
    with pytest.raises(CentralizedComparatorParseError, match="I will not use tags"):
        tr.train()


def test_custom_centralized_adapter_with_local_comparator(tiny_model_dir, tmp_path):
    class SplitHalves:
        """Toy adapter: the first half of the text is role 0, the rest role 1."""

        def build_prompt(self, item, prompts):
            return "Write for both roles: " + " / ".join(prompts)

        def parse_completion(self, text, item, num_agents):
            half = len(text) // 2
            return [text[:half], text[half:]]

    args = iter_args(num_iterations=1, comparator_policy="current", comparator_generation_mode="centralized")
    tr = make_trainer(tiny_model_dir, tmp_path, args=args, num_items=3, centralized_comparator_adapter=SplitHalves())
    tr.train()
    (round1,) = _round_files(tmp_path)
    assert round1["num_pairs"] > 0


def test_bad_adapter_is_rejected(tiny_model_dir, tmp_path):
    args = iter_args(num_iterations=1, comparator_generation_mode="centralized")
    with pytest.raises(TypeError, match=r"centralized_comparator_adapter\.build_prompt must be callable"):
        make_trainer(tiny_model_dir, tmp_path, args=args, centralized_comparator_adapter=object())


def test_cli_saved_config_has_no_literal_key(tmp_path, monkeypatch):
    """The CLI's saved config.yaml keeps every option but the literal key."""
    from pathlib import Path

    import yaml

    from comlrl_lightning.cli import main

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:  # max_epochs=0 trains nothing: the CLI says so and exits 3
        _fit_nothing(main, root)
    assert stop.value.code == 3
    saved = list(tmp_path.rglob("config.yaml"))
    assert saved
    text = saved[0].read_text()
    assert KEY not in text
    assert yaml.safe_load(text)["model"]["init_args"]["args"]["comparator_api_url"] == "http://127.0.0.1:9/x"


def _fit_nothing(main, root):
    main(["fit", "--config", str(root / "configs/madpo/tiny.yaml"), "--trainer.max_epochs=0",
          "--model.init_args.args.preference_num_candidates=2", "--model.init_args.args.max_new_tokens=2",
          "--data.init_args.train_dataset=builtin:cooperative_eval", "--trainer.enable_progress_bar=false",
          "--trainer.callbacks=[]",
          "--model.init_args.args=comlrl_lightning.config.MADPOIterConfig",
          "--model.init_args.args.comparator_policy=api",
          "--model.init_args.args.comparator_api_url=http://127.0.0.1:9/x",
          f"--model.init_args.args.comparator_api_key={KEY}"])
