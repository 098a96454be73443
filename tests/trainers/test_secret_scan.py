"""Issue 14, finding 7: a key planted in every place a user can put one never lands in a file of the run.

One tiny fit per trainer family (MADPO, MADPOIter through the CLI with an API comparator on loopback, MAGRPO, IAC,
MARLHFIter with an API comparator), CSV logger and checkpoints on; then every file under the run folder is
scanned for the key (``hparams.yaml``, ``config.yaml``, ``metrics.csv``, round files, snapshots, ``.ckpt`` bytes
and their unpickled contents). The key sits in ``comparator_api_key``, a custom header, the URL query, the extra
body and the environment; ``--print_config`` never prints it either.

Issue 31, item 6: the CLI run also takes the key on its command line and logs to an offline W&B run: stdout,
stderr (file descriptors, so W&B's and Lightning's own prints count) and every W&B file (the binary ``.wandb``
run with its recorded arguments, the debug logs) are scanned too; parse and value errors print no key.
"""

from __future__ import annotations

import base64
import json
import sys

import pytest
import torch
from conftest import cpu_trainer_kwargs
from fake_llm_server import FakeLLMServer
from iterative_helpers import task_items
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward

KEY = "sk-PLANTED-5ecret-9f8e7d6c5b4a"
ENV = "COMLRL_TEST_PLANTED_KEY"


@pytest.fixture
def server():
    s = FakeLLMServer().start()
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def _planted_env(monkeypatch):
    monkeypatch.setenv(ENV, KEY)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


def _api_options(server, literal: bool = True) -> dict:
    """The key in every place: literal (or through the env var), a custom header, the URL query, the body."""
    opts = dict(comparator_policy="api", comparator_api_url=server.url("openai", query=f"api-key={KEY}"),
                comparator_api_format="openai", comparator_api_model="cmp", comparator_api_timeout=5.0,
                comparator_api_headers={"X-Org-Ident": KEY}, comparator_api_extra_body={"user": KEY})
    opts.update({"comparator_api_key": KEY} if literal else {"comparator_api_key_env": ENV})
    return opts


def _run(root) -> dict:
    """Facade kwargs: CSV logger and checkpoints under ``root``."""
    return {"trainer_kwargs": cpu_trainer_kwargs(default_root_dir=str(root), logger=CSVLogger(str(root / "logs")),
                                                 enable_checkpointing=True),
            "callbacks": [ModelCheckpoint(dirpath=str(root / "ckpt"), save_last=True)]}


def _scan(root) -> tuple[int, list[str]]:
    """(files scanned, files holding the key); checkpoints are also unpickled and their contents searched."""
    files = [p for p in root.rglob("*") if p.is_file()]
    hits = [str(p) for p in files if KEY.encode() in p.read_bytes()]
    for p in files:
        if p.suffix == ".ckpt" and KEY in repr(torch.load(p, weights_only=False)):
            hits.append(f"{p} (unpickled)")
    return len(files), hits


def _assert_clean(root, min_files: int = 3) -> None:
    scanned, hits = _scan(root)
    print(f"secret scan of {root.name}: {scanned} files, {len(hits)} with the key")
    assert not hits, hits
    assert scanned >= min_files
    names = {p.name for p in root.rglob("*")}
    assert "hparams.yaml" in names and any(n.endswith(".ckpt") for n in names), sorted(names)


def test_madpo_run_has_no_key(tiny_model_dir, tmp_path):
    from comlrl_lightning import MADPOTrainer
    from comlrl_lightning.config import MADPOConfig

    args = MADPOConfig(num_agents=2, num_train_epochs=1, preference_num_candidates=2, preference_pairs_per_sample=1,
                       train_batch_size=2, max_new_tokens=4, eval_interval=0)
    tr = MADPOTrainer(agent_model=str(tiny_model_dir), train_dataset=task_items(2), reward_func=cooperative_reward,
                      formatters=FORMATTERS, args=args, **_run(tmp_path))
    tr.train()
    _assert_clean(tmp_path)


def test_magrpo_and_iac_runs_have_no_key(tiny_model_dir, tmp_path):
    from comlrl_lightning import IACTrainer, MAGRPOTrainer
    from comlrl_lightning.config import IACConfig, MAGRPOConfig

    common = dict(num_agents=2, num_train_epochs=1, max_new_tokens=4, rollout_buffer_size=2, eval_interval=0)
    runs = [(MAGRPOTrainer, MAGRPOConfig(num_generations=2, **common)),
            (IACTrainer, IACConfig(num_generations=1, use_separate_critic=False, **common))]
    for cls, args in runs:
        root = tmp_path / cls.__name__
        tr = cls(agent_model=str(tiny_model_dir), train_dataset=task_items(1), reward_func=cooperative_reward,
                 formatters=FORMATTERS, args=args, **_run(root))
        tr.train()
        _assert_clean(root)


def test_marlhf_iter_with_api_comparator_has_no_key(tiny_model_dir, tmp_path, server):
    from comlrl_lightning import MARLHFIterTrainer
    from comlrl_lightning.config import MARLHFIterConfig

    args = MARLHFIterConfig(num_agents=2, num_iterations=1, num_train_epochs=1, preference_num_candidates=2,
                            preference_pairs_per_sample=1, num_generations=2, max_new_tokens=4,
                            rollout_buffer_size=2, eval_interval=0, **_api_options(server, literal=False))
    tr = MARLHFIterTrainer(agent_model=str(tiny_model_dir), train_dataset=task_items(2),
                           reward_func=cooperative_reward, formatters=FORMATTERS, args=args, evaluation=False,
                           **_run(tmp_path))
    tr.train()
    assert server.requests and all(r.headers["authorization"] == f"Bearer {KEY}" for r in server.requests)
    assert all(r.headers["x-org-ident"] == KEY and r.body["user"] == KEY for r in server.requests)
    _assert_clean(tmp_path)


def _key_forms() -> list[str]:
    return [KEY, KEY.lower(), KEY.upper(), base64.b64encode(KEY.encode()).decode()[:-4]]


def _cli_config(tmp_path, server, tiny_model_dir, wandb: bool = False) -> str:
    train = tmp_path / "train.jsonl"
    train.write_text("\n".join(json.dumps(item) for item in task_items(2)) + "\n")
    root = tmp_path / "run"
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "devices": 1, "default_root_dir": str(root), "max_epochs": 1,
            "reload_dataloaders_every_n_epochs": 1, "num_sanity_val_steps": 0, "enable_progress_bar": False,
            "enable_model_summary": False,
            "logger": [{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(root)}}]
            + ([{"class_path": "lightning.pytorch.loggers.WandbLogger",
                 "init_args": {"save_dir": str(root), "offline": True, "project": "secret-scan"}}] if wandb else []),
            "callbacks": [
                {"class_path": "comlrl_lightning.callbacks.IterativePreferenceCollection"},
                {"class_path": "comlrl_lightning.callbacks.ReplaySelection"},
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                 "init_args": {"dirpath": str(root / "ckpt"), "save_last": True}},
            ],
        },
        "model": {"class_path": "comlrl_lightning.modules.MADPOModule", "init_args": {
            "agent_model": str(tiny_model_dir),
            "args": {"class_path": "comlrl_lightning.config.MADPOIterConfig", "init_args": {
                "num_agents": 2, "num_iterations": 1, "num_train_epochs": 1, "preference_num_candidates": 2,
                "preference_pairs_per_sample": 1, "train_batch_size": 2, "max_new_tokens": 4, "eval_interval": 0,
                **_api_options(server)}}}},
        "data": {"class_path": "comlrl_lightning.data.madpo.IterativePreferenceDataModule", "init_args": {
            "train_dataset": str(train), "reward_func": "comlrl_lightning.envs.cooperative.cooperative_reward",
            "formatters": "comlrl_lightning.envs.cooperative.FORMATTERS", "num_agents": 2, "seed": 0}},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_madpo_iter_cli_run_and_print_config_have_no_key(tiny_model_dir, tmp_path, server, capfd, monkeypatch):
    import wandb

    from comlrl_lightning.cli import main

    config = _cli_config(tmp_path, server, tiny_model_dir, wandb=True)
    with pytest.raises(SystemExit):
        main(["fit", "--config", config, "--print_config"])
    printed = capfd.readouterr().out
    assert "comparator_api_url" in printed and KEY not in printed

    # the key on the command line too, as a user types it: W&B records sys.argv as the run's arguments
    key_option = f"--model.init_args.args.init_args.comparator_api_key={KEY}"
    monkeypatch.setattr(sys, "argv", ["comlrl-lightning", "fit", "--config", config, key_option])
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "run"))
    try:
        main()
    finally:
        wandb.finish()
        wandb.teardown()  # joins W&B's service process: every record is on disk
    assert sys.argv[-1] == key_option  # restored for the caller
    out, err = capfd.readouterr()
    assert not [f for f in _key_forms() if f in out + err], (out[-2000:], err[-2000:])
    assert server.requests and all(r.headers["authorization"] == f"Bearer {KEY}" for r in server.requests)
    root = tmp_path / "run"
    assert any(p.name == "config.yaml" for p in root.rglob("*"))
    runs = list(root.rglob("*.wandb"))
    assert len(runs) == 1, sorted(p.name for p in root.rglob("*"))
    record = runs[0].read_bytes()  # the run's metadata record lists the arguments, each one a protobuf string
    assert b"--model.init_args.args.init_args.comparator_api_key=***" in record and b"--config" in record
    _assert_clean(root, min_files=6)


@pytest.mark.parametrize("bad", [
    "--model.init_args.args.init_args.comparator_api_extra_body={KEY}",  # a string where a mapping goes
    "--model.init_args.args.init_args.comparator_api_timeout=-1",  # a value error of the config
    "--model.init_args.args.init_args.comparator_api_key={KEY}x",  # fine, with a bad value next
])
def test_cli_parse_and_value_errors_print_no_key(tiny_model_dir, tmp_path, server, capfd, bad):
    from comlrl_lightning.cli import main

    config = _cli_config(tmp_path, server, tiny_model_dir)
    argv = ["fit", "--config", config, bad.format(KEY=KEY)]
    if "api_key" in bad:
        argv.append("--model.init_args.args.init_args.num_agents=0")
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    out, err = capfd.readouterr()
    # the error is about the bad value (the key-bearing option itself, or num_agents next to a good key)
    assert "error:" in err and ("num_agents" if "api_key" in bad else "comparator_api") in err, err[-3000:]
    assert not [f for f in _key_forms() if f in out + err], err[-3000:]


def test_facade_wandb_run_records_no_key_from_the_scripts_command_line(tiny_model_dir, tmp_path, server, capfd,
                                                                       monkeypatch):
    """A Python script that takes the key on its own command line and logs to W&B through ``wandb_config``: the
    run's recorded arguments hold the key redacted, and the script's ``sys.argv`` is restored after ``train``."""
    import wandb

    from comlrl_lightning import MADPOIterTrainer
    from comlrl_lightning.config import MADPOIterConfig

    argv = ["train_team.py", f"--comparator-api-key={KEY}", "--note", KEY]
    monkeypatch.setattr(sys, "argv", list(argv))
    monkeypatch.setenv("WANDB_MODE", "offline")
    root = tmp_path / "run"
    args = MADPOIterConfig(num_agents=2, num_iterations=1, num_train_epochs=1, preference_num_candidates=2,
                           preference_pairs_per_sample=1, max_new_tokens=4, eval_interval=0, **_api_options(server))
    tr = MADPOIterTrainer(agent_model=str(tiny_model_dir), train_dataset=task_items(2), reward_func=cooperative_reward,
                          formatters=FORMATTERS, args=args, wandb_config={"project": "secret-scan", "dir": str(root)},
                          trainer_kwargs={k: v for k, v in cpu_trainer_kwargs(default_root_dir=str(root)).items()
                                          if k != "logger"})
    try:
        tr.train()
    finally:
        wandb.finish()
        wandb.teardown()  # joins W&B's service process: every record is on disk
    assert sys.argv == argv  # restored for the script
    assert server.requests  # the comparator did use the key
    runs = list(root.rglob("*.wandb"))
    assert len(runs) == 1, sorted(p.name for p in root.rglob("*"))
    assert b"--note" in runs[0].read_bytes()  # the recorded arguments are there, redacted
    out, err = capfd.readouterr()
    assert not [f for f in _key_forms() if f in out + err], (out[-2000:], err[-2000:])
    scanned, hits = _scan(root)
    assert not hits and scanned >= 3, (scanned, hits)
