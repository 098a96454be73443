"""MADPO: token mask, gradient equivalence, the module's updates, bad input, CLI, W&B, learning."""

from __future__ import annotations

import csv
import math
import struct
from pathlib import Path

import pytest
import torch
from conftest import cpu_trainer_kwargs
from learning_seed import LEARNING_SEED

from comlrl_lightning.agents import build_agents
from comlrl_lightning.config import MADPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.logprobs import build_scoring_batch, sequence_logps
from comlrl_lightning.losses import madpo_loss, madpo_loss_detached_others
from comlrl_lightning.trainers.preference import MADPOTrainer

ROOT = Path(__file__).resolve().parents[2]
ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music", "owls", "maps")]


def small_args(**kw) -> MADPOConfig:
    base = dict(num_train_epochs=1, preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=8,
                temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2, train_batch_size=4,
                eval_interval=0, eval_num_samples=2)
    base.update(kw)
    return MADPOConfig(**base)


def make_trainer(model_dir, args=None, **kw) -> MADPOTrainer:
    kw.setdefault("agent_model", model_dir)
    return MADPOTrainer(train_dataset=ITEMS, eval_dataset=ITEMS[:2], reward_func=cooperative_reward,
                        formatters=FORMATTERS, args=args or small_args(),
                        trainer_kwargs=cpu_trainer_kwargs(), **kw)


# --- token mask ---------------------------------------------------------------------------------------------

def test_scoring_batch_drops_last_completion_token_and_padding():
    batch = build_scoring_batch([[5, 6], [7]], [[10, 11, 12, 0, 0], [13, 14]], pad_id=0)
    # row 0: prompt 5 6, completion trimmed at pad -> 10 11 12, last dropped -> 10 11 scored
    assert batch["input_ids"][0].tolist() == [5, 6, 10, 11]
    assert batch["score_mask"][0].tolist() == [0, 0, 1, 1]
    # row 1: prompt 7, completion 13 14 -> 13 scored, then right padding
    assert batch["input_ids"][1].tolist() == [7, 13, 0, 0]
    assert batch["score_mask"][1].tolist() == [0, 1, 0, 0]
    assert batch["attention_mask"][1].tolist() == [1, 1, 0, 0]


def test_sequence_logps_matches_unpadded_manual_sum(tiny_model_dir):
    team = build_agents(tiny_model_dir, num_agents=1)
    model = team.models[0].eval()
    prompts, comps = [[3, 4, 5], [6]], [[20, 21, 22, 1], [30, 31]]
    got = sequence_logps(model, build_scoring_batch(prompts, comps, pad_id=0))
    for r, (p, c) in enumerate(zip(prompts, comps)):
        ids = torch.tensor([p + c])
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        # every completion token except the last, each predicted by the previous position
        expected = sum(logp[len(p) + k - 1, c[k]].item() for k in range(len(c) - 1))
        assert got[r].item() == pytest.approx(expected, abs=1e-4)


# --- gradient equivalence -----------------------------------------------------------------------------------

def _grads(models):
    return [torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None]) for m in models]


def test_single_backward_equals_detached_two_pass(tiny_model_dir):
    team = build_agents(tiny_model_dir, num_agents=2)
    with torch.no_grad():  # make the agents differ
        for p in team.models[1].parameters():
            p.add_(0.01 * torch.randn_like(p))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 500, (4,), generator=g).tolist() for _ in range(3)]
    wins = [torch.randint(5, 500, (6,), generator=g).tolist() for _ in range(3)]
    loses = [torch.randint(5, 500, (5,), generator=g).tolist() for _ in range(3)]
    batch = build_scoring_batch(prompts * 2, wins + loses, pad_id=0)

    def logps(i):
        lp = sequence_logps(team.models[i], batch)
        return lp[:3], lp[3:]

    for m in team.models:
        m.zero_grad()
    out = [logps(i) for i in range(2)]
    loss, _ = madpo_loss(torch.stack([w for w, _ in out]), torch.stack([lo for _, lo in out]), 0.1)
    loss.mean().backward()
    joint = _grads(team.models)

    for m in team.models:
        m.zero_grad()
    with torch.no_grad():
        det = [logps(i) for i in range(2)]
    for i in range(2):
        w_i, l_i = logps(i)
        w = torch.stack([w_i if k == i else det[k][0] for k in range(2)])
        lo = torch.stack([l_i if k == i else det[k][1] for k in range(2)])
        madpo_loss_detached_others(w, lo, 0.1, i).backward()
    two_pass = _grads(team.models)
    for a, b in zip(joint, two_pass):
        assert a.abs().max() > 0
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


# --- the module ---------------------------------------------------------------------------------------------

def _snapshot(team, i):
    return [p.detach().clone() for p in team.parameters_of(i)]


def test_every_agent_parameter_changes_after_training(tiny_model_dir):
    tr = make_trainer(tiny_model_dir)
    before = [_snapshot(tr.team, i) for i in range(2)]
    metrics = tr.train()
    assert metrics["round/num_pairs"] > 0
    for i in range(2):
        after = _snapshot(tr.team, i)
        for b, a in zip(before[i], after):
            assert not torch.equal(a, b)
    # global_step counts every optimizer step of every agent
    n_batches = math.ceil(metrics["round/num_pairs"] / 4)
    assert tr.trainer.global_step == 2 * n_batches
    assert tr.module.env_step == 2 * int(metrics["round/num_pairs"])
    for key in ("train/loss", "train/accuracy", "train/agent0/rewards/margins", "train/agent1/logps/chosen",
                "train/agent1/logps/rejected", "turn_1/reward_mean", "turn_1/expected_return", "eval/reward_mean"):
        assert key in metrics


def test_shared_model_object_uses_sequential_detached_updates(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tr = make_trainer(None, agent_model=None, agents=[model, model], tokenizer=tok)
    assert tr.team.shares_parameters()
    before = _snapshot(tr.team, 0)
    tr.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, _snapshot(tr.team, 0)))


def test_lora_agents_train_adapters_only(tiny_model_dir, tmp_path):
    tr = make_trainer(tiny_model_dir, lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    base = {n: p.detach().clone() for n, p in tr.team.models[0].named_parameters() if "lora_" not in n}
    adapters = [_snapshot(tr.team, i) for i in range(2)]
    tr.train()
    for n, p in tr.team.models[0].named_parameters():
        if n in base:
            assert torch.equal(p, base[n]), n
    for i in range(2):
        assert any(not torch.equal(a, b) for a, b in zip(adapters[i], _snapshot(tr.team, i)))
    paths = tr.save_model(str(tmp_path / "out"))
    assert [Path(p).name for p in paths] == ["agent_0", "agent_1"]
    assert (Path(paths[1]) / "adapter_config.json").is_file()


def test_save_model_is_loadable(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tr = make_trainer(tiny_model_dir)
    tr.train()
    tr.save_model(str(tmp_path))
    for i in range(2):
        m = AutoModelForCausalLM.from_pretrained(tmp_path / f"agent_{i}")
        AutoTokenizer.from_pretrained(tmp_path / f"agent_{i}")
        ref = dict(tr.team.models[i].named_parameters())
        for n, p in m.named_parameters():
            torch.testing.assert_close(p, ref[n].detach())


def test_no_pairs_returns_without_updating(tiny_model_dir, caplog):
    tr = MADPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=lambda a, b: [1.0],
                      args=small_args(), trainer_kwargs=cpu_trainer_kwargs())
    before = _snapshot(tr.team, 0)
    with pytest.warns(UserWarning, match="no non-tied preference pairs"):
        tr.train()
    assert tr.trainer.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(tr.team, 0)))


def test_nan_loss_raises_with_pair_index(tiny_model_dir, monkeypatch):
    tr = make_trainer(tiny_model_dir)
    original = tr.module._agent_logps

    def poisoned(batch, i, grad=True):
        w, lo = original(batch, i, grad)
        return w + torch.where(batch["pair_index"].to(w.device) == batch["pair_index"][0], float("nan"), 0.0), lo

    monkeypatch.setattr(tr.module, "_agent_logps", poisoned)
    with pytest.raises(FloatingPointError, match=r"pair\(s\) \[\d+\]"):
        tr.train()


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_dpo_beta_must_be_positive(bad):
    with pytest.raises(ValueError, match="dpo_beta must be > 0"):
        MADPOConfig(dpo_beta=bad)


def test_reference_kl_on_madpo_warns_and_adds_nothing():
    with pytest.warns(UserWarning, match="reference-free"):
        MADPOConfig(reference_kl_enabled=True)


def test_facade_bad_input(tiny_model_dir):
    with pytest.raises(ValueError, match="Either agent_model or agents"):
        MADPOTrainer(train_dataset=ITEMS, reward_func=cooperative_reward)
    with pytest.raises(ValueError, match="reward_func must be a callable"):
        MADPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=None)
    with pytest.raises(ValueError, match="Number of formatters must match num_agents"):
        make_trainer(tiny_model_dir, formatters=None) if False else MADPOTrainer(
            agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=cooperative_reward,
            formatters=[FORMATTERS[0]], args=small_args())


def test_missing_prompt_field_is_named(tiny_model_dir):
    tr = MADPOTrainer(agent_model=tiny_model_dir, train_dataset=[{"question": "x"}], reward_func=cooperative_reward,
                      args=small_args(), trainer_kwargs=cpu_trainer_kwargs())
    with pytest.raises(ValueError, match=r"Dataset item 0 has no field 'prompt'"):
        tr.train()


# --- CLI and loggers ----------------------------------------------------------------------------------------

CLI_OVERRIDES = [
    "--model.init_args.args.num_train_epochs=1", "--model.init_args.args.preference_num_candidates=4",
    "--model.init_args.args.preference_pairs_per_sample=2", "--model.init_args.args.max_new_tokens=8",
    "--model.init_args.args.eval_num_samples=2", "--trainer.enable_progress_bar=false",
]


def test_cli_fit_runs_config_and_writes_csv_and_agents(tmp_path, monkeypatch, capsys):
    from comlrl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(ROOT / "configs/madpo/tiny.yaml"), *CLI_OVERRIDES])
    out = capsys.readouterr().out
    assert "task reward (eval/reward_mean): before" in out
    metrics_files = list(tmp_path.glob("outputs/madpo_tiny/lightning_logs/version_*/metrics.csv"))
    assert metrics_files
    header = next(csv.reader(open(metrics_files[0])))
    for key in ("train/loss", "train/accuracy", "train/agent0/rewards/margins", "round/num_pairs", "eval/reward_mean"):
        assert key in header
    assert (tmp_path / "outputs/madpo_tiny/lightning_logs/version_0/agents/agent_1/config.json").is_file()


def test_cli_print_config_round_trips(tmp_path, capsys):
    from comlrl_lightning.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(ROOT / "configs/madpo/tiny.yaml"), "--print_config"])
    assert exc.value.code == 0
    printed = capsys.readouterr().out
    assert "dpo_beta: 0.1" in printed and "class_path: comlrl_lightning.modules.MADPOModule" in printed


def test_wandb_offline_logging(tiny_model_dir, tmp_path, monkeypatch):
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    logger = WandbLogger(project="comlrl-test", save_dir=str(tmp_path), offline=True)
    tr = MADPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, eval_dataset=ITEMS[:2],
                      reward_func=cooperative_reward, formatters=FORMATTERS, args=small_args(),
                      trainer_kwargs=cpu_trainer_kwargs(logger=logger))
    tr.train()
    logger.experiment.finish()
    wandb.teardown()  # joins W&B's service process: every record is on disk, whatever the machine load
    history = list(tmp_path.rglob("*.wandb"))
    assert len(history) == 1, history
    keys = {item.key or "/".join(item.nested_key) for record in wandb_records(history[0])
            if record.WhichOneof("record_type") == "history" for item in record.history.item}
    assert {"train/loss", "eval/reward_mean"} <= keys, keys


def wandb_records(path: Path):
    """The protobuf records of an offline ``.wandb`` file: a 7-byte file header (``:W&B``, magic, version),
    then LevelDB-log chunks in 32 KiB blocks (4-byte CRC, 2-byte length, 1-byte type: 1 full, 2 first,
    3 middle, 4 last; a block tail shorter than a chunk header is zero padding). wandb >= 0.22 ships no
    Python reader of its own."""
    from wandb.proto import wandb_internal_pb2

    data, pos, parts = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B", data[:7]
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if room >= 7 else (0, 0, 0)
        if kind == 0:  # padding up to the next block
            pos += room
            continue
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def test_metrics_doc_lists_every_logged_key(tiny_model_dir):
    readme = (ROOT / "docs" / "metrics.md").read_text()
    tr = make_trainer(tiny_model_dir, args=small_args(eval_interval=1))
    metrics = tr.train()
    documented = readme.replace("{i}", "0")
    for key in metrics:
        if key in ("loss", "pairs"):  # progress-bar only
            continue
        assert f"`{key}`" in documented or f"`{key.replace('agent1', 'agent0')}`" in documented, key


# --- learning -----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_madpo_raises_task_reward_on_builtin_task():
    """Measured on seeds 0-9 (benchmarks/learning_tests.sh, 8 epochs): gains +0.33 +0.46 +0.38 +0.31 +0.31 +0.15
    +0.21 +0.18 +0.25 +0.32 (5 epochs gave +0.115 on seed 5). The evaluation uses fixed seeds (the initial value is
    exact); evaluating the untrained policy with other eval seeds moves the mean by about ±0.03. The bar (+0.1) is
    more than three times that spread and below the smallest gain measured."""

    args = MADPOConfig(num_train_epochs=8, preference_num_candidates=16, preference_pairs_per_sample=8,
                       max_new_tokens=16, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2,
                       train_batch_size=16, eval_interval=0, eval_num_samples=8, seed=LEARNING_SEED)
    tr = MADPOTrainer(agent_model="embedded:tiny", train_dataset="builtin:cooperative",
                      eval_dataset="builtin:cooperative_eval", reward_func=cooperative_reward,
                      formatters=FORMATTERS, args=args, trainer_kwargs=cpu_trainer_kwargs())
    tr.evaluation.samples_per_item = 8
    tr.evaluation.eval_interval = 10**9  # only before the first update and at the end
    tr.train()
    history = tr.evaluation.history
    before, after = history[0][1]["eval/reward_mean"], history[-1][1]["eval/reward_mean"]
    print(f"MADPO seed {LEARNING_SEED}: before {before:.3f} after {after:.3f} gain {after - before:+.3f}")
    assert after - before > 0.1, (before, after)


def test_pairs_with_only_empty_completions_are_rejected(tiny_model_dir):
    from comlrl_lightning.data.madpo import PreferenceDataModule
    from comlrl_lightning.preferences import PreferencePair

    dm = PreferenceDataModule(train_dataset=ITEMS, eval_dataset=None, reward_func=cooperative_reward,
                              formatters=FORMATTERS)
    good = PreferencePair(["a", "b"], ["x", ""], ["", ""], 1.0, 0.0, 0.5)
    empty = PreferencePair(["a", "b"], ["", " "], ["", ""], 1.0, 0.0, 0.5)
    dm.add_round([good])
    with pytest.raises(ValueError, match=r"Preference pair 1: every winner and loser completion is an empty string"):
        dm.add_round([good, empty])
    with pytest.raises(ValueError, match=r"Preference pair 0: winner_completions has 1 entries"):
        dm.add_round([PreferencePair(["a", "b"], ["x"], ["y", "z"], 1.0, 0.0, 0.5)])


def test_optimizer_and_scheduler_from_yaml(tmp_path, monkeypatch):
    from comlrl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    seen = {}

    class Probe(__import__("lightning").Callback):
        def on_train_end(self, trainer, pl_module):
            seen["opts"] = [type(o.optimizer if hasattr(o, "optimizer") else o).__name__
                            for o in trainer.optimizers]
            seen["lr"] = [o.param_groups[0]["lr"] for o in trainer.optimizers]
            seen["scheds"] = len(trainer.lr_scheduler_configs)

    monkeypatch.setattr("comlrl_lightning.callbacks.ExportAgents.on_train_end", lambda self, t, m: Probe().on_train_end(t, m))
    main(["fit", "--config", str(ROOT / "configs/madpo/tiny.yaml"), *CLI_OVERRIDES,
          "--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.lr=0.05",
          "--model.init_args.lr_scheduler=torch.optim.lr_scheduler.StepLR",
          "--model.init_args.lr_scheduler.step_size=1000"])
    assert seen["opts"] == ["SGD", "SGD"] and seen["lr"] == [0.05, 0.05] and seen["scheds"] == 2


def test_gradient_accumulation_halves_the_optimizer_steps(tiny_model_dir):
    plain = make_trainer(tiny_model_dir, args=small_args(train_batch_size=1))
    plain.train()
    accum = make_trainer(tiny_model_dir, args=small_args(train_batch_size=1, gradient_accumulation_steps=2))
    accum.train()
    pairs = int(accum.trainer.callback_metrics["round/num_pairs"])
    assert plain.trainer.global_step == 2 * pairs
    assert accum.trainer.global_step == 2 * math.ceil(pairs / 2)  # a last odd batch is stepped at epoch end


def test_wandb_config_builds_an_offline_wandb_logger(tiny_model_dir, tmp_path, monkeypatch):
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    tr = MADPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=cooperative_reward,
                      formatters=FORMATTERS, args=small_args(),
                      wandb_config={"project": "comlrl-test", "name": "madpo-run", "dir": str(tmp_path / "wb"),
                                    "config_sections": {"dataset": {"name": "coop", "type": "toy"}}},
                      trainer_kwargs={"enable_progress_bar": False, "enable_model_summary": False,
                                      "accelerator": "cpu"})
    logger = tr.trainer.logger
    assert isinstance(logger, WandbLogger)
    tr.train()
    run_config = dict(logger.experiment.config)
    logger.experiment.finish()
    assert run_config["algorithm"] == "MADPO" and run_config["dpo_beta"] == 0.1
    assert run_config["dataset_name"] == "coop"
    assert list((tmp_path / "wb").rglob("*.wandb"))
