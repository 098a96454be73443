"""MAGRPO module and facades: config checks, the EOS mask, updates, buffers, metrics, CLI configs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from conftest import cpu_trainer_kwargs

from comlrl_lightning.config.magrpo import MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.multiturn.transitions import plain_transition
from comlrl_lightning.multiturn.tree import NodeSample
from comlrl_lightning.trainers.reinforce import (
    MAGRPOTrainer,
    MAREINFORCETrainer,
    MAReMaxTrainer,
    MARLOOTrainer,
)

ROOT = Path(__file__).resolve().parents[2]
ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]


def small_args(cls=MAGRPOConfig, **kw):
    base = {"num_train_epochs": 1, "num_generations": 2, "max_new_tokens": 6, "temperature": 1.0, "top_p": 1.0, "top_k": None,
                "agent_learning_rate": 1e-2, "eval_interval": 0, "eval_num_samples": 1, "logging_steps": 1,
                "rollout_buffer_size": 1}
    base.update(kw)
    return cls(**base)


def make_trainer(model_dir, args=None, cls=MAGRPOTrainer, items=ITEMS, **kw):
    return cls(agent_model=model_dir, train_dataset=items, eval_dataset=items[:1], reward_func=cooperative_reward,
               formatters=FORMATTERS, args=args or small_args(), trainer_kwargs=cpu_trainer_kwargs(), **kw)


# --- configuration --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,fragment", [
    ({"num_generations": 1}, "num_generations must be >= 2"),
    ({"joint_mode": "diagonal"}, "joint_mode must be one of: aligned, cross"),
    ({"advantage_mode": "median"}, "advantage_mode must be one of"),
    ({"parallel_training": "auto"}, "parallel_training only supports"),
    ({"parallel_training": "mp"}, "agent_devices"),
    ({"num_turns": 0}, "num_turns"),
    ({"num_train_epochs": 0}, "num_train_epochs"),
    ({"rollout_buffer_size": 0}, "rollout_buffer_size"),
    ({"train_batch_size": 0}, "train_batch_size"),
    ({"eval_interval": -1}, "eval_interval"),
    ({"eval_num_samples": -1}, "eval_num_samples"),
    ({"logging_steps": 0}, "logging_steps"),
    ({"eval_batch_size": 0}, "eval_batch_size"),
    ({"num_agents": 0}, "num_agents"),
])
def test_config_rejects_bad_values_naming_option_value_and_allowed(kw, fragment):
    with pytest.raises(ValueError) as info:
        MAGRPOConfig(**kw)
    msg = str(info.value)
    assert fragment in msg and "Got " in msg and "Allowed" in msg


def test_config_defaults_aliases_and_subclasses():
    cfg = MAGRPOConfig()
    assert cfg.num_turns == 1 and cfg.early_termination_threshold is None  # docs/decisions.md, decision 10
    assert cfg.train_batch_size == cfg.rollout_buffer_size == 2
    assert MAGRPOConfig(joint_mode="Align").joint_mode == "aligned"
    assert MAGRPOConfig(joint_mode=" CROSSED ").joint_mode == "cross"
    assert MAGRPOConfig(parallel_training="null").parallel_training == "none"
    assert MAGRPOConfig(parallel_training="mp", agent_devices="cpu").parallel_training == "mp"
    assert [c().advantage_mode for c in (MAGRPOConfig, MAREINFORCEConfig, MARLOOConfig, MAReMaxConfig)] == \
        ["mean", "raw", "rloo", "max"]
    assert MARLOOConfig(advantage_mode="max").advantage_mode == "max"


def test_multiturn_without_transition_fails_at_construction():
    with pytest.raises(ValueError, match="Multi-turn MAGRPO requires an external_transition"):
        MAGRPOTrainer(agent_model="never-loaded", train_dataset=ITEMS, reward_func=cooperative_reward,
                      args=MAGRPOConfig(num_turns=2))
    with pytest.raises(ValueError, match="Multi-turn MARLOO requires"):
        MARLOOTrainer(agent_model="never-loaded", train_dataset=ITEMS, reward_func=cooperative_reward,
                      args=MARLOOConfig(num_turns=2))


# --- the loss -------------------------------------------------------------------------------------------------

def test_padding_after_eos_never_counts(tiny_model_dir):
    from comlrl_lightning.modules.magrpo import MAGRPOModule, trim_completion

    module = MAGRPOModule(agent_model=tiny_model_dir, args=small_args(num_agents=1))
    tok = module.team.tokenizers[0]
    eos, pad = tok.eos_token_id, tok.pad_token_id
    assert eos != pad
    prompt = tok("Topic: owls.")["input_ids"]

    def loss(rows):
        s = NodeSample(agent=0, turn=0, env_step=2, prompt_ids=prompt, completion_ids=rows, returns=[1.0, 0.0],
                       advantages=[1.0, -1.0], kls=None, node_mean_reward=0.5, node_mean_return=0.5, reward_std=0.5)
        with torch.no_grad():
            return module.minibatch_loss(0, [s]).item()

    base = loss([[40, 41, eos], [50, eos]])
    assert loss([[40, 41, eos, 77, 78, 79], [50, eos, 90]]) == pytest.approx(base, abs=1e-6)  # junk after EOS
    assert loss([[40, 41, eos, pad, pad], [50, eos, pad, pad, pad]]) == pytest.approx(base, abs=1e-6)
    assert loss([[40, 42, eos], [50, eos]]) != pytest.approx(base, abs=1e-6)  # a real token does count
    assert trim_completion([40, 41, eos, 45, pad, 46], eos, pad) == [40, 41, eos]
    assert trim_completion([40, 41, pad, eos], eos, pad) == [40, 41]


# --- training -------------------------------------------------------------------------------------------------

def test_every_agent_changes_and_metrics_are_logged(tiny_model_dir):
    tr = make_trainer(tiny_model_dir, items=ITEMS[:2], args=small_args(reference_kl_enabled=True))
    before = [[p.detach().clone() for p in tr.team.parameters_of(i)] for i in range(2)]
    ref_before = [p.detach().clone() for p in tr.module.reference.model_for(0).parameters()]
    metrics = tr.train()
    for i in range(2):
        after = tr.team.parameters_of(i)
        assert all(not torch.equal(b, a) for b, a in zip(before[i], after)), f"agent {i} has unchanged parameters"
    assert all(torch.equal(b, a) for b, a in zip(ref_before, tr.module.reference.model_for(0).parameters()))
    m = tr.module
    assert m.env_step == 2 * 2 and m.updates_seen == 2 and m.optimizer_steps == 2 * 2
    assert tr.trainer.global_step == 4
    for key in ("turn_1/reward_mean", "turn_1/expected_return", "train/loss", "env_step",
                "train/agent0/reward_std", "train/agent1/completions/mean_length", "train/agent0/kl",
                "train/agent1/kl", "turn_1/reference_kl_mean", "turn_1/reference_kl_penalty_mean",
                "eval/reward_mean"):
        assert key in metrics, key
    assert metrics["env_step"] == 4.0 and metrics["train/agent0/kl"] >= 0


def test_buffer_schedule_and_epoch_flush(tiny_model_dir):
    # 2 items, 2-turn aligned tree with K=2: 3 nodes per item per agent; buffer 4, minibatch 3.
    args = small_args(num_turns=2, rollout_buffer_size=4, train_batch_size=3, num_train_epochs=1)
    tr = make_trainer(tiny_model_dir, items=ITEMS[:2], args=args, external_transition=plain_transition)
    drains = []
    original = tr.module.drain_agents

    def spy(agents):
        drains.extend((agent, sorted(s.turn for s in tr.module.rollout_buffers[agent])) for agent in agents)
        return original(agents)

    tr.module.drain_agents = spy
    tr.train()
    # per agent 6 node samples in env-step order: item 0 gives t0, t1, t1; item 1's root makes the buffer
    # full (4: turns 0, 1, 1, 0), its two children are flushed at the epoch's last step
    for agent in (0, 1):
        assert [turns for a, turns in drains if a == agent] == [[0, 0, 1, 1], [1, 1]]
    assert all(not b for b in tr.module.rollout_buffers)
    assert tr.module.env_step == 2 * (2 + 2 * 2)
    # optimizer steps per drain = sum over turns of ceil(n_turn / 3)
    expected = sum(-(-t.count(0) // 3) + -(-t.count(1) // 3) for _, t in drains)
    assert tr.module.optimizer_steps == expected


def test_multiturn_cross_trains_and_logs_both_turns(tiny_model_dir):
    args = small_args(num_turns=2, joint_mode="crossed", rollout_buffer_size=5)
    tr = make_trainer(tiny_model_dir, items=ITEMS[:1], args=args, external_transition=plain_transition)
    metrics = tr.train()
    assert tr.module.env_step == 4 + 4 * 4
    assert "turn_1/expected_return" in metrics and "turn_2/reward_mean" in metrics
    assert metrics["turn_1/expected_return"] > metrics["turn_1/reward_mean"] - 1e-9  # rewards are >= 0


def test_variants_train(tiny_model_dir):
    for cls, mode in ((MAREINFORCETrainer, "raw"), (MARLOOTrainer, "rloo"), (MAReMaxTrainer, "max")):
        tr = cls(agent_model=tiny_model_dir, train_dataset=ITEMS[:1], reward_func=cooperative_reward,
                 formatters=FORMATTERS, trainer_kwargs=cpu_trainer_kwargs(),
                 args=small_args(cls.config_cls, advantage_normalization=False))
        assert tr.args.advantage_mode == mode and tr.module.algorithm_name == cls.algorithm_name
        tr.train()
        assert tr.module.optimizer_steps == 2


def test_bad_reward_names_the_item(tiny_model_dir):
    def nan_reward(a, b):
        return [float("nan")]

    tr = MAGRPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS[:1], reward_func=nan_reward,
                       formatters=FORMATTERS, args=small_args(), trainer_kwargs=cpu_trainer_kwargs())
    with pytest.raises(ValueError, match=r"task item 0 \(turn 1, branch"):
        tr.train()


# --- CLI configs ----------------------------------------------------------------------------------------------

CLI_OVERRIDES = ["--trainer.limit_train_batches=1", "--model.init_args.args.num_generations=2",
                 "--model.init_args.args.max_new_tokens=4", "--model.init_args.args.eval_num_samples=1",
                 "--trainer.enable_progress_bar=false"]


@pytest.mark.parametrize("name", ["tiny", "multiturn_tiny", "multiturn_cross_tiny"])
def test_cli_configs_print(name, capsys):
    from comlrl_lightning.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(ROOT / f"configs/magrpo/{name}.yaml"), "--print_config"])
    assert exc.value.code == 0
    assert "class_path: comlrl_lightning.modules.magrpo.MAGRPOModule" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["tiny", "multiturn_tiny", "multiturn_cross_tiny"])
def test_cli_configs_run(name, tmp_path, monkeypatch, capsys):
    from comlrl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(ROOT / f"configs/magrpo/{name}.yaml"), *CLI_OVERRIDES])
    assert "task reward (eval/reward_mean): before" in capsys.readouterr().out
    files = list(tmp_path.glob(f"outputs/magrpo_{name}/lightning_logs/version_*/metrics.csv"))
    assert files
    with open(files[0]) as fh:
        header = next(csv.reader(fh))
    for key in ("turn_1/reward_mean", "turn_1/expected_return", "train/loss", "env_step", "eval/reward_mean"):
        assert key in header
    if name != "tiny":
        assert "turn_2/reward_mean" in header
    assert (tmp_path / f"outputs/magrpo_{name}/lightning_logs/version_0/agents/agent_1/config.json").is_file()


def test_evaluate_turns_single_paths(tiny_model_dir):
    from comlrl_lightning.modules.magrpo import MAGRPOModule

    class Oracle:
        def __init__(self):
            self.calls = []

        def score(self, prompts, texts, item, where):
            self.calls.append(where)
            return (2.0 if "turn 2" in where else 1.0), 0.0

    module = MAGRPOModule(agent_model=tiny_model_dir, args=small_args(num_turns=2))
    seen = []

    def transition(**kw):
        seen.append(kw["response_history_per_agent"])
        return plain_transition(**kw)

    oracle = Oracle()
    out = module.evaluate_turns(ITEMS[:2], FORMATTERS, oracle, transition, samples_per_item=3)
    assert out == {"eval/turn_1/reward_mean": 1.0, "eval/turn_1/expected_return": 3.0,
                   "eval/turn_2/reward_mean": 2.0, "eval/turn_2/expected_return": 2.0}
    assert len(oracle.calls) == 2 * 3 * 2 and len(seen) == 2 * 3  # one path per sample, no tree
    assert all(len(h[0]) == 1 for h in seen)


def test_progress_state_survives_a_weights_only_checkpoint(tiny_model_dir, tmp_path):
    from comlrl_lightning.modules.magrpo import MAGRPOModule

    module = MAGRPOModule(agent_model=tiny_model_dir, args=small_args(seed=3))
    module.env_step, module.updates_seen, module.optimizer_steps = 12, 3, 6
    module.streams[1].next_seed()
    module.shuffle_rng.random()
    ckpt: dict = {}
    module.on_save_checkpoint(ckpt)
    torch.save(ckpt, tmp_path / "state.pt")
    restored = MAGRPOModule(agent_model=tiny_model_dir, args=small_args(seed=3))
    restored.on_load_checkpoint(torch.load(tmp_path / "state.pt", weights_only=True))
    assert (restored.env_step, restored.updates_seen, restored.optimizer_steps) == (12, 3, 6)
    assert [s.next_seed() for s in restored.streams] == [s.next_seed() for s in module.streams]
    assert restored.shuffle_rng.random() == module.shuffle_rng.random()


@pytest.mark.parametrize("trainer_cls,config_cls", [(MAGRPOTrainer, MAGRPOConfig), (MAReMaxTrainer, MAReMaxConfig)])
def test_fit_resumes_from_a_lightning_checkpoint(tiny_model_dir, tmp_path, trainer_cls, config_cls):
    """Lightning loads a resumed checkpoint weights_only; the args object among its hyperparameters must be
    allow-listed (it was not: resuming any MAGRPO-family run failed with an UnpicklingError)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    args = small_args(config_cls, num_train_epochs=2, seed=1)

    def build(**tk):
        return trainer_cls(agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=cooperative_reward,
                           formatters=FORMATTERS, args=args, trainer_kwargs=cpu_trainer_kwargs(**tk))

    first = build(max_epochs=1, enable_checkpointing=True, default_root_dir=str(tmp_path),
                  callbacks=[ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_top_k=-1, every_n_epochs=1)])
    first.train()
    (ckpt,) = (tmp_path / "ckpt").glob("*.ckpt")
    resumed = build(default_root_dir=str(tmp_path))
    resumed.train(ckpt_path=str(ckpt))
    full = build()
    full.train()
    assert 0 < first.trainer.global_step < resumed.trainer.global_step == full.trainer.global_step
    assert resumed.module.optimizer_steps == full.module.optimizer_steps


def test_evaluation_callback_covers_every_turn_of_a_multiturn_run(tmp_path, monkeypatch, capsys):
    """TaskRewardEvaluation evaluates each turn of a 2-turn MAGRPO run through the module's own rollout."""
    from pathlib import Path

    from comlrl_lightning.cli import main

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(root / "configs/magrpo/multiturn_tiny.yaml"), "--trainer.max_epochs=1",
          "--trainer.limit_train_batches=1", "--trainer.enable_progress_bar=false",
          "--trainer.logger=CSVLogger", "--trainer.logger.save_dir=logs",
          "--model.init_args.args.num_generations=2", "--model.init_args.args.max_new_tokens=4",
          "--model.init_args.args.eval_num_samples=2"])
    import csv

    (metrics_file,) = list(tmp_path.glob("logs/lightning_logs/version_*/metrics.csv"))
    header = next(csv.reader(open(metrics_file)))
    for key in ("eval/turn_1/reward_mean", "eval/turn_2/reward_mean", "eval/turn_1/expected_return",
                "eval/reward_mean"):
        assert key in header, key
    rows = [r for r in csv.DictReader(open(metrics_file)) if r.get("eval/turn_2/reward_mean")]
    r = rows[-1]
    mean = (float(r["eval/turn_1/reward_mean"]) + float(r["eval/turn_2/reward_mean"])) / 2
    assert abs(float(r["eval/reward_mean"]) - mean) < 1e-6
