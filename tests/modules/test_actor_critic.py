"""IAC / MAAC: config rules, TD targets in the rollout, critic sources, EOS masking, update schedule, training
of every owned parameter (MAAC, IAC separate critics, IAC attached heads), and the YAML configs via the CLI."""

from __future__ import annotations

import csv
import math
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import cpu_trainer_kwargs

from comlrl_lightning.agents import load_model, load_tokenizer
from comlrl_lightning.config.actor_critic import IACConfig, MAACConfig
from comlrl_lightning.data.task import TaskDataModule
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.losses import policy_gradient_loss
from comlrl_lightning.modules.actor_critic import ActorCriticModule, joint_critic_text, trim_completion
from comlrl_lightning.multiturn.transitions import plain_transition
from comlrl_lightning.rewards import RewardOracle
from comlrl_lightning.trainers.actor_critic import IACTrainer, MAACTrainer

ROOT = Path(__file__).resolve().parents[2]
ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music", "owls", "maps")]
SMALL = {"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0, "agent_learning_rate": 1e-2,
         "critic_learning_rate": 1e-2, "num_train_epochs": 1, "eval_interval": 0}


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models run faster on one thread, and far steadier on a shared 2-core machine."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# --- config --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [IACConfig, MAACConfig])
def test_config_rules(cls):
    assert cls().num_generations == 1 and cls().early_termination_threshold is None and cls().num_turns == 1
    with pytest.raises(ValueError, match=f"Multi-turn {cls._method} currently supports num_generations == 1"):
        cls(num_turns=2, num_generations=2)
    assert cls(num_turns=2, num_generations=1).num_generations == 1
    assert cls(num_turns=1, num_generations=4).num_generations == 4
    assert cls(critic_type="Q").critic_type == "q"
    bad = [({"critic_type": "x"}, "critic_type must be one of: v, q. Got 'x'"),
           ({"num_generations": 0}, "num_generations must be >= 1"),
           ({"rollout_buffer_size": 0}, "rollout_buffer_size must be >= 1"),
           ({"eval_interval": -1}, "eval_interval must be >= 0"),
           ({"parallel_training": "auto"}, "parallel_training only supports: none, mp"),
           ({"parallel_training": "mp"}, "requires explicit agent_devices"),
           ({"reference_kl_coef": -0.1}, "reference_kl_coef must be >= 0"),
           ({"reference_kl_enabled": True, "reference_devices": ["cpu"] * 3}, "reference_devices length")]
    for kw, message in bad:
        with pytest.raises(ValueError, match=message):
            cls(**kw)
    with pytest.raises(ValueError, match="critic_devices"):
        cls(parallel_training="mp", agent_devices="cpu")
    assert cls(parallel_training="mp", agent_devices="cpu", critic_devices="cpu").parallel_training == "mp"


def test_config_critic_learning_rate_rules():
    assert IACConfig(critic_learning_rate=None, agent_learning_rate=3e-4).critic_learning_rate == 3e-4
    with pytest.raises(ValueError, match="critic_learning_rate"):
        MAACConfig(critic_learning_rate=None)
    with pytest.raises(ValueError, match="value_clip_range"):
        IACConfig(value_clip_range=0)
    assert IACConfig(parallel_training="mp", agent_devices="cpu", use_separate_critic=False).parallel_training == "mp"


# --- helpers -------------------------------------------------------------------------------------------------

def test_joint_critic_text_and_completion_trim():
    assert joint_critic_text(["p0", "p1"]) == "[Agent 0] p0\n\n[Agent 1] p1"
    assert joint_critic_text(["p0", "p1"], ["a", "b"]) == (
        "[Agent 0] p0\n\n[Agent 1] p1\n\n[Joint Action]\n\n[Agent 0 action]\na\n\n[Agent 1 action]\nb")
    assert trim_completion([5, 6, 1, 0, 0], pad_id=0, eos_id=1) == [5, 6, 1]  # EOS kept, padding dropped
    assert trim_completion([5, 6, 1, 7, 8], pad_id=0, eos_id=1) == [5, 6, 1]  # nothing after EOS counts
    assert trim_completion([5, 6, 1, 1, 1], pad_id=1, eos_id=1) == [5, 6, 1]  # pad == eos: the first is the EOS


def attached_module(model_dir, **kw) -> ActorCriticModule:
    return ActorCriticModule(agent_model=model_dir, args=IACConfig(use_separate_critic=False, **{**SMALL, **kw}))


def test_padding_after_eos_is_masked_in_actor_loss(tiny_model_dir):
    m = attached_module(tiny_model_dir)
    pad, eos = m._ids(0)
    assert pad != eos
    base = {"prompt_ids": [20, 21, 22], "turn": 0}
    variants = [[30, 31, eos], [30, 31, eos, pad, pad, pad], [30, 31, eos, 40, 41]]
    samples = [dict(base, completion_ids=c) for c in variants]
    batch, pos = m._sequence_batch(0, samples)
    assert batch["score_mask"].sum(-1).tolist() == [3, 3, 3]
    with torch.no_grad():
        logps, _ = m._actor_forward(0, batch, with_values=False)
        seq = (logps * batch["score_mask"]).sum(-1)
        torch.testing.assert_close(seq, seq[:1].expand(3))
        adv = torch.tensor([1.0, 1.0, 1.0])
        losses = [policy_gradient_loss(logps[k:k + 1], batch["score_mask"][k:k + 1], adv[:1]) for k in range(3)]
    assert losses[0] == losses[1] == losses[2]
    # by hand: log p(30|prompt) + log p(31|...) + log p(eos|...) on the unpadded sequence
    ids = torch.tensor([[20, 21, 22, 30, 31, eos]])
    with torch.no_grad():
        lp = torch.log_softmax(m.team.models[0](input_ids=ids).logits[0].float(), -1)
    expected = sum(lp[2 + k, ids[0, 3 + k]].item() for k in range(3))
    assert seq[0].item() == pytest.approx(expected, abs=1e-4)
    assert pos.tolist() == [2, 2, 2]  # V critic: the last prompt token
    m.args.critic_type = "q"
    assert m._sequence_batch(0, samples)[1].tolist() == [5, 5, 5]  # Q critic: the last counted completion token


# --- TD targets inside the rollout (hand-checked with a stub critic) -----------------------------------------

def _turn_reward(rewards):
    calls = [0]

    def reward(c1, c2):
        t = calls[0]
        calls[0] += 1
        return list(rewards[t])  # one value per agent

    return reward


@pytest.mark.parametrize("threshold, executed", [(None, 3), (4.0, 2)])
def test_td_targets_no_bootstrap_after_last_turn(tiny_model_dir, threshold, executed):
    gamma = 0.5
    m = attached_module(tiny_model_dir, num_turns=3, discount=gamma, early_termination_threshold=threshold)
    rewards = [(1.0, 2.0), (5.0, 6.0), (-3.0, 7.0)]  # turn 2 mean 5.5 > 4.0 ends the episode early
    values = [10.0, 20.0, 30.0]  # stub critic: V_old(h_t) by turn, any agent
    m._turn_values = lambda turn: [[values[s[0]["turn"]]] * len(s) for s in turn]
    m.bind_task(FORMATTERS, RewardOracle(_turn_reward(rewards)), plain_transition)
    samples = m.collect(ITEMS[0], 0)
    assert len(samples) == 2 * executed
    for agent in range(2):
        traj = sorted((s for s in samples if s["agent"] == agent), key=lambda s: s["turn"])
        r = [rewards[t][agent] for t in range(executed)]
        expected = [r[t] + gamma * values[t + 1] for t in range(executed - 1)] + [r[-1]]  # no bootstrap at the end
        assert [s["target"] for s in traj] == pytest.approx(expected)
        assert [s["return"] for s in traj] == pytest.approx([sum(r[t:]) for t in range(executed)])
        assert [s["old_value"] for s in traj] == values[:executed]
    # turn prompts: turn 0 from the formatter, later turns from the transition through the formatter
    assert samples[0]["prompt_ids"] != next(s for s in samples if s["turn"] == 1)["prompt_ids"]


def test_multiturn_evaluation_reports_every_turn_and_keeps_training_streams(tiny_model_dir):
    m = attached_module(tiny_model_dir, num_turns=2)
    m.bind_task(FORMATTERS, RewardOracle(_turn_reward([(1.0, 3.0), (2.0, 2.0)] * 2)), plain_transition)
    state = [s.state_dict()["rng_state"].clone() for s in m.streams]
    out = m.evaluate_turns(ITEMS[:2])
    assert out["eval/turn_1/reward_mean"] == pytest.approx(2.0) == out["eval/reward_mean"]
    assert out["eval/turn_2/reward_mean"] == pytest.approx(2.0)
    assert out["eval/turn_1/expected_return"] == pytest.approx(4.0)
    assert all(torch.equal(a, s.state_dict()["rng_state"]) for a, s in zip(state, m.streams))
    # what was sampled, for CoMLRL's eval_logger: completions[agent][item][turn], the texts the reward saw
    assert len(out.completions) == 2 and all(len(per_item) == 2 for per_item in out.completions)
    assert all(len(turns) == 2 and all(isinstance(c, str) for c in turns) for a in out.completions for turns in a)
    assert out.batch_items == ITEMS[:2] and out.raw_prompts == [i["prompt"] for i in ITEMS[:2]]


def test_multiturn_eval_logger_sees_the_sampled_texts(tiny_model_dir):
    seen = []

    def reward(c1, c2):
        seen.append((c1[0], c2[0]))
        return [1.0]

    def logger(agent_completions_turns, batch_items, prompts):
        return [{"turns": float(len(agent_completions_turns[0][k]))} for k in range(len(prompts))]

    def aggregator(metrics, num_turns):
        return {"turns_mean": sum(m["turns"] for m in metrics) / len(metrics)}

    tr = IACTrainer(agent_model=tiny_model_dir, reward_func=reward, train_dataset=ITEMS[:1], eval_dataset=ITEMS[:2],
                    formatters=FORMATTERS, external_transition=plain_transition, eval_logger=logger,
                    eval_aggregator=aggregator, trainer_kwargs=cpu_trainer_kwargs(),
                    args=IACConfig(num_turns=2, eval_num_samples=2, use_separate_critic=False, **SMALL))
    tr.module.bind_task(tr.datamodule.formatters, tr.datamodule.oracle, tr.datamodule.external_transition)
    seen.clear()
    out = tr.module.evaluate(ITEMS[:2], tr.datamodule)
    # the recorded texts are exactly the ones the reward scored, turn by turn
    assert [(out.completions[0][k][t], out.completions[1][k][t]) for t in range(2) for k in range(2)] == seen
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "records no completions" warning any more
        metrics = tr.train()
    assert metrics["eval/turns_mean"] == 2.0


def test_reference_kl_is_subtracted_from_the_reward(tiny_model_dir):
    m = attached_module(tiny_model_dir, num_turns=2, discount=1.0, reference_kl_enabled=True,
                        reference_kl_coef=0.5)
    with torch.no_grad():  # move the policy away from its frozen reference
        for p in m.team.models[0].parameters():
            p.add_(0.05 * torch.randn_like(p))
    m._turn_values = lambda turn: [[0.0] * len(s) for s in turn]
    m.bind_task(FORMATTERS, RewardOracle(_turn_reward([(1.0, 1.0), (2.0, 2.0)])), plain_transition)
    samples = m.collect(ITEMS[1], 1)
    a0 = sorted((s for s in samples if s["agent"] == 0), key=lambda s: s["turn"])
    assert all(s["kl"] > 0 for s in a0)
    assert [s["shaped"] for s in a0] == pytest.approx([1.0 - 0.5 * a0[0]["kl"], 2.0 - 0.5 * a0[1]["kl"]])
    assert a0[0]["target"] == pytest.approx(a0[0]["shaped"])  # V_old = 0 → y_0 = r̃_0 + γ·0
    assert a0[0]["return"] == pytest.approx(a0[0]["shaped"] + a0[1]["shaped"])


# --- critic sources ------------------------------------------------------------------------------------------

def test_missing_or_wrong_critic_source_is_a_clear_error(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    objects = [load_model(tiny_model_dir), load_model(tiny_model_dir)]
    for args in (IACConfig(**SMALL), MAACConfig(**SMALL)):
        with pytest.raises(ValueError, match="Either critic_model or critics must be provided"):
            ActorCriticModule(agent_model=None, agents=objects, tokenizer=tok, args=args)
    with pytest.raises(ValueError, match="critics can only be provided when use_separate_critic=True"):
        ActorCriticModule(agent_model=tiny_model_dir, critic_model=tiny_model_dir,
                          args=IACConfig(use_separate_critic=False, **SMALL))
    with pytest.raises(ValueError, match=r"critics length \(2\) must match 1 critic"):
        ActorCriticModule(agent_model=tiny_model_dir, critics=[tiny_model_dir] * 2, args=MAACConfig(**SMALL))
    with pytest.raises(ValueError, match=r"critics length \(1\) must match num_agents \(2\)"):
        ActorCriticModule(agent_model=tiny_model_dir, critics=[tiny_model_dir], args=IACConfig(**SMALL))
    # model-object agents are fine with an explicit critic; the attached head needs none
    m = ActorCriticModule(agent_model=None, agents=objects, tokenizer=tok, critic_model=tiny_model_dir,
                          args=MAACConfig(**SMALL))
    assert len(m.critics) == 1
    with pytest.raises(ValueError, match="Multi-turn IAC requires an external_transition"):
        IACTrainer(agent_model=tiny_model_dir, reward_func=cooperative_reward, train_dataset=ITEMS,
                   args=IACConfig(num_turns=2, **SMALL))


# --- training through Lightning ------------------------------------------------------------------------------

def _snapshot(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def _unchanged(module, before):
    return [n for n, p in module.named_parameters() if torch.equal(p.detach(), before[n])]


def _spy_updates(module, record):
    original = module._update

    def spy(i, samples, *rest):
        assert not module._collecting, "an update ran in the middle of an episode"
        record.append({"agent": i, "n": len(samples), "turns": sorted({s["turn"] for s in samples}),
                       "items_done": module.updates_seen})
        return original(i, samples, *rest)

    module._update = spy
    collect = module.collect

    def collecting(*a, **k):
        module._collecting = True
        try:
            return collect(*a, **k)
        finally:
            module._collecting = False

    module.collect = collecting
    module._collecting = False


def _fit(module, items, transition=None, **trainer_kw):
    dm = TaskDataModule(train_dataset=items, eval_dataset=None, reward_func=cooperative_reward,
                        formatters=FORMATTERS, external_transition=transition)
    trainer = L.Trainer(**cpu_trainer_kwargs(max_epochs=1, **trainer_kw))
    trainer.fit(module, datamodule=dm)
    return trainer


def test_iac_attached_heads_schedule_and_every_parameter_trains(tiny_model_dir):
    # N=2, K=2 samples per agent per item, buffer 3: drains after items 2 and 4 (4 samples each, the whole
    # buffer), the 5th item's 2 samples are flushed at the end of the epoch (in its last training step).
    m = attached_module(tiny_model_dir, num_generations=2, rollout_buffer_size=3, train_batch_size=2)
    record: list[dict] = []
    _spy_updates(m, record)
    before = _snapshot(m)
    trainer = _fit(m, ITEMS[:5])
    assert [(r["agent"], r["n"], r["items_done"]) for r in record] == [
        (0, 4, 1), (1, 4, 1), (0, 4, 3), (1, 4, 3), (0, 2, 4), (1, 2, 4)]
    assert m.env_step == 10 and all(not b for b in m.rollout_buffers)
    assert trainer.global_step == 2 * 2 * 2 + 2 * 1  # one optimizer per agent (it owns the head too)
    assert _unchanged(m, before) == []
    assert any(n.startswith("value_heads.") for n in before)
    metrics = trainer.callback_metrics
    for key in ("turn_1/reward_mean", "turn_1/expected_return", "train/agent0/actor_loss", "train/agent1/value_loss",
                "train/agent0/completions/mean_length", "env_step"):
        assert key in metrics and math.isfinite(float(metrics[key]))


def test_iac_separate_critics_multiturn_updates_only_after_episodes(tiny_model_dir, tmp_path):
    args = IACConfig(num_turns=2, rollout_buffer_size=2, train_batch_size=1, **SMALL)
    m = ActorCriticModule(agent_model=tiny_model_dir, args=args)
    assert len(m.critics) == 2 and not m.value_heads
    record: list[dict] = []
    _spy_updates(m, record)
    before = _snapshot(m)
    trainer = _fit(m, ITEMS[:2], transition=plain_transition)
    # each episode gives 2 samples per agent (T'=2): one drain per item, one update per (agent, turn)
    assert [(r["agent"], r["turns"], r["items_done"]) for r in record] == [
        (0, [0], 0), (0, [1], 0), (1, [0], 0), (1, [1], 0), (0, [0], 1), (0, [1], 1), (1, [0], 1), (1, [1], 1)]
    assert m.env_step == 4
    assert trainer.global_step == 8 * 2  # per sample: an actor step and a critic step
    assert _unchanged(m, before) == []
    assert any(n.startswith("critics.1.") for n in before)
    # progress state survives a real checkpoint loaded weights_only (plain types only)
    trainer.save_checkpoint(tmp_path / "ac.ckpt")
    ckpt = torch.load(tmp_path / "ac.ckpt", weights_only=True)
    draws = [m._rng.random() for _ in range(3)]
    m.env_step, m.updates_seen = 0, 0
    m.on_load_checkpoint(ckpt)
    assert (m.env_step, m.updates_seen) == (4, 2) and [m._rng.random() for _ in range(3)] == draws


def test_maac_q_critic_with_reference_kl_trains_actors_and_critic(tiny_model_dir, tmp_path):
    args = MAACConfig(critic_type="q", num_generations=2, rollout_buffer_size=4, train_batch_size=4,
                      reference_kl_enabled=True, reference_kl_coef=0.05, **SMALL)
    tr = MAACTrainer(agent_model=tiny_model_dir, reward_func=cooperative_reward, formatters=FORMATTERS,
                     train_dataset=ITEMS[:2], args=args, trainer_kwargs=cpu_trainer_kwargs(),
                     metrics_callback=lambda rollouts: {"custom/samples": len(rollouts), "skipped": "text"})
    m = tr.module
    assert len(m.critics) == 1
    before = _snapshot(m)
    metrics = tr.train()
    assert m.num_drains == 1 and m.env_step == 4
    assert tr.trainer.global_step == 2 * 2  # per agent minibatch: actor step, then a shared-critic step
    assert _unchanged(m, before) == []
    assert metrics["custom/samples"] == 4 and "skipped" not in metrics  # metrics_callback, per item
    for key in ("train/critic/value_loss", "train/agent0/kl", "train/agent1/kl", "turn_1/reference_kl_mean"):
        assert key in metrics and math.isfinite(metrics[key])
    q_inputs = {tuple(s["critic_ids"]) for s in m.last_rollouts}
    assert len(q_inputs) == 2  # Q critic: one joint input per generation, shared by both agents
    out = tr.save_model(str(tmp_path / "saved"))
    assert len(out) == 2 and (Path(out[0]).parent / "critic" / "value_head.pt").is_file()


# --- YAML configs --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["iac", "maac"])
def test_cli_config_runs(method, tmp_path, monkeypatch, capsys):
    from comlrl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(ROOT / f"configs/{method}/tiny.yaml"), "--trainer.limit_train_batches", "4",
          "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
          "--model.init_args.args.max_new_tokens", "8", "--model.init_args.args.eval_num_samples", "1"])
    assert "task reward (eval/reward_mean): before" in capsys.readouterr().out
    with open(next(tmp_path.glob(f"outputs/{method}_tiny/lightning_logs/*/metrics.csv"))) as f:
        rows = list(csv.DictReader(f))
    keys = {k for r in rows for k, v in r.items() if v}
    assert {"train/agent0/actor_loss", "train/agent1/actor_loss", "turn_1/reward_mean", "env_step"} <= keys
    assert (tmp_path / f"outputs/{method}_tiny/lightning_logs/version_0/agents/agent_1").is_dir()
