"""MARLHF and MARLHFIter: configs, bad input, the learned-reward hook, fresh reward models per round, the
scoring-oracle switch, task-reward evaluation, every RL backend, and the YAML configs."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import cpu_trainer_kwargs

from comlrl_lightning.callbacks.evaluation import evaluate_team
from comlrl_lightning.config.marlhf import MARLHFConfig, MARLHFIterConfig
from comlrl_lightning.data.sources import load_task_items
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.preferences import PreferencePair
from comlrl_lightning.reward_model import LearnedRewardOracle

ROOT = Path(__file__).resolve().parents[2]
TINY = {"num_train_epochs": 1, "num_generations": 2, "max_new_tokens": 6, "temperature": 1.0, "top_p": 1.0, "top_k": None,
            "agent_learning_rate": 1e-2, "rollout_buffer_size": 1, "eval_interval": 0, "eval_num_samples": 2,
            "preference_num_candidates": 4, "preference_pairs_per_sample": 2, "reward_learning_rate": 1e-3,
            "reward_train_batch_size": 4, "reward_num_train_epochs": 1, "logging_steps": 1, "seed": 0}


def marlhf_args(**kw) -> MARLHFConfig:
    return MARLHFConfig(**{**TINY, **kw})


def iter_args(**kw) -> MARLHFIterConfig:
    return MARLHFIterConfig(**{**TINY, "num_iterations": 2, **kw})


def make(model_dir, args, iterative=False, n_items=3, eval_dataset=None, root=None, **kw):
    from comlrl_lightning.trainers.marlhf import MARLHFIterTrainer, MARLHFTrainer

    cls = MARLHFIterTrainer if iterative else MARLHFTrainer
    tk = cpu_trainer_kwargs(**({"default_root_dir": str(root)} if root is not None else {}))
    return cls(agent_model=str(model_dir), train_dataset=load_task_items("builtin:cooperative")[:n_items],
               eval_dataset=eval_dataset, reward_func=cooperative_reward, formatters=FORMATTERS, args=args,
               trainer_kwargs=tk, **kw)


class StubRewardModel:
    """Disagrees with the task: shorter joint answers score higher (task reward is in [0, 1.5], this is <= 0)."""

    def __init__(self):
        self.calls = 0

    @staticmethod
    def value(completions) -> float:
        return -float(sum(len(c) for c in completions))

    def score(self, prompts_per_pair, completions_per_pair, batch_size=16):
        self.calls += 1
        return [self.value(c) for c in completions_per_pair]


@pytest.fixture
def stub_fit(monkeypatch):
    """Replace the reward-model fit by a stub model (records the pairs each fit got)."""
    from comlrl_lightning.callbacks import reward_model as learned_reward

    fits = []

    def fake_fit(self, trainer, pl_module, pairs, seed):
        fits.append(list(pairs))
        self.fits += 1
        self.current = StubRewardModel()
        return self.current

    monkeypatch.setattr(learned_reward._RewardModelFitting, "fit", fake_fit)
    return fits


# --- configs ---------------------------------------------------------------------------------------------


def test_rl_algorithm_not_in_list_names_the_allowed_ones():
    with pytest.raises(ValueError) as exc:
        MARLHFConfig(rl_algorithm="ppo")
    msg = str(exc.value)
    assert msg.startswith("rl_algorithm must be one of: magrpo, mareinforce, maremax, marloo, maac, iac.")
    assert "'ppo'" in msg


@pytest.mark.parametrize("alg, mode", [("magrpo", "mean"), ("mareinforce", "raw"), ("mareforce", "raw"),
                                       ("maremax", "max"), ("marloo", "rloo"), (None, "mean"), (" MARLOO ", "rloo")])
def test_advantage_mode_is_forced_from_rl_algorithm(alg, mode):
    other = "max" if mode != "max" else "mean"
    assert MARLHFConfig(rl_algorithm=alg, advantage_mode=other).advantage_mode == mode


def test_actor_critic_backends_keep_advantage_mode_and_allow_one_generation():
    c = MARLHFConfig(rl_algorithm="iac", num_generations=1, advantage_mode="max")
    assert c.advantage_mode == "max" and c.is_actor_critic
    child = c.actor_critic_config()
    assert type(child).__name__ == "IACConfig" and child.critic_learning_rate == c.agent_learning_rate
    assert type(MARLHFConfig(rl_algorithm="maac", num_generations=1).actor_critic_config()).__name__ == "MAACConfig"


@pytest.mark.parametrize("kw, opening", [
    ({"num_generations": 1}, "num_generations must be >= 2 for MAGRPO-family MARLHF backends."),
    ({"rl_algorithm": "iac", "num_generations": 0}, "num_generations must be >= 1."),
    ({"reward_learning_rate": 0}, "reward_learning_rate must be > 0."),
    ({"reward_num_train_epochs": 0}, "reward_num_train_epochs must be >= 1."),
    ({"reward_train_batch_size": 0}, "reward_train_batch_size must be >= 1."),
    ({"reward_max_length": 0}, "reward_max_length must be >= 1 or null."),
    ({"critic_learning_rate": 0}, "critic_learning_rate must be > 0 or null."),
    ({"critic_type": "x"}, "critic_type must be one of: v, q."),
    ({"value_loss_coef": 0}, "value_loss_coef must be > 0."),
    ({"value_clip_range": 0}, "value_clip_range must be > 0 or null."),
    ({"reward_model_device": "nonsense:x"}, "reward_model_device must be a torch device string or null."),
])
def test_marlhf_validation_messages(kw, opening):
    with pytest.raises(ValueError) as exc:
        MARLHFConfig(**kw)
    assert str(exc.value).startswith(opening)
    assert "Got" in str(exc.value) and "Allowed" in str(exc.value)


def test_madpo_checks_run_before_the_marlhf_ones():
    with pytest.raises(ValueError, match="^num_agents must be >= 1"):
        MARLHFConfig(num_agents=0, rl_algorithm="ppo")


def test_marlhf_defaults_and_device_decision():
    c = MARLHFConfig()
    assert (c.rl_algorithm, c.num_generations, c.reward_model_device, c.reward_num_train_epochs) == ("magrpo", 4, None, 1)
    assert (c.num_train_epochs, c.preference_num_candidates, c.preference_pairs_per_sample) == (20, 80, 16)
    assert c.reward_model_options().reward_learning_rate == 1e-5


def test_marlhf_reference_kl_is_used_not_warned(recwarn):
    MARLHFConfig(reference_kl_enabled=True)
    assert not [w for w in recwarn if "reference-free" in str(w.message)]
    with pytest.raises(ValueError, match="reference_devices length"):
        MARLHFConfig(reference_kl_enabled=True, reference_devices=["cpu", "cpu", "cpu"])


def test_marlhf_iter_defaults_and_scoring_reward():
    c = MARLHFIterConfig()
    assert (c.num_train_epochs, c.preference_num_candidates, c.preference_pairs_per_sample, c.pair_selection,
            c.reward_num_train_epochs, c.preference_scoring_reward, c.num_iterations) == (
        2, 20, 4, "comparator_reward", 2, "task", 6)
    for alias in ("task", "oracle", "environment", "ENV"):
        assert MARLHFIterConfig(preference_scoring_reward=alias).preference_scoring_reward == "task"
    for alias in ("reward_model", "model", " Learned "):
        assert MARLHFIterConfig(preference_scoring_reward=alias).preference_scoring_reward == "reward_model"
    with pytest.raises(ValueError, match="^preference_scoring_reward must be one of: task, reward_model."):
        MARLHFIterConfig(preference_scoring_reward="human")
    with pytest.raises(ValueError, match="comparator_reward"):
        MARLHFConfig(pair_selection="comparator_reward")
    with pytest.raises(TypeError):
        MARLHFConfig(preference_scoring_reward="task")
    assert "***" in repr(MARLHFIterConfig(comparator_api_key="sk-secret")) and "sk-secret" not in repr(
        MARLHFIterConfig(comparator_api_key="sk-secret"))


# --- bad input ---------------------------------------------------------------------------------------------


def test_model_objects_without_reward_model_name_fail_clearly(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comlrl_lightning.trainers.marlhf import MARLHFTrainer

    models = [AutoModelForCausalLM.from_pretrained(tiny_model_dir) for _ in range(2)]
    for m in models:  # objects whose source cannot be loaded again (loadable names are used: test_dropin_smaller)
        m.config._name_or_path = ""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(ValueError, match="reward_model_name must be provided when agent models are objects"):
        MARLHFTrainer(agents=models, tokenizer=tok, train_dataset=load_task_items("builtin:cooperative")[:2],
                      reward_func=cooperative_reward, formatters=FORMATTERS, args=marlhf_args())
    with pytest.raises(ValueError, match="critic_model_name must be provided for MARLHF with MAAC"):
        MARLHFTrainer(agents=models, tokenizer=tok, train_dataset=load_task_items("builtin:cooperative")[:2],
                      reward_func=cooperative_reward, formatters=FORMATTERS,
                      args=marlhf_args(rl_algorithm="maac", num_generations=1, reward_model_name=tiny_model_dir))


def _tiny_rm(model_dir, tokenizer=None, **opts):
    from comlrl_lightning.config.reward_model import RewardModelOptions
    from comlrl_lightning.modules.reward_model import JointRewardModel

    return JointRewardModel(str(model_dir), tokenizer=tokenizer, args=RewardModelOptions(**opts), seed=0)


def test_reward_tokenizer_without_pad_falls_back_to_eos(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.pad_token = None
    rm = _tiny_rm(tiny_model_dir, tokenizer=tok)
    assert rm.tokenizer.pad_token_id == rm.tokenizer.eos_token_id
    oracle = LearnedRewardOracle(rm, FORMATTERS)
    item = load_task_items("builtin:cooperative")[0]
    alone = oracle.score([], ["a", "a much longer elaboration"], item, 0)[0]
    both = oracle.reward_func(["a", "b"], ["a much longer elaboration", "x"], batch_items=[item])
    assert both[0] == pytest.approx(alone, abs=1e-5)  # same score alone and padded in a batch


def test_reward_max_length_shorter_than_prompt_is_a_clear_error(tiny_model_dir):
    oracle = LearnedRewardOracle(_tiny_rm(tiny_model_dir, reward_max_length=8), FORMATTERS)
    item = load_task_items("builtin:cooperative")[0]
    with pytest.raises(ValueError, match="reward_max_length=8 is too short"):
        oracle.score([], ["a", "b"], item, 0)


def test_pairs_with_empty_text_are_dropped_with_a_warning(tiny_model_dir):
    from comlrl_lightning.callbacks import LearnedRewardFit
    from comlrl_lightning.modules.marlhf import MARLHFModule

    module = MARLHFModule(agent_model=str(tiny_model_dir), args=marlhf_args(reward_model_name=str(tiny_model_dir)))
    trainer = L.Trainer(**cpu_trainer_kwargs())
    good = PreferencePair(["p1", "p2"], ["a long answer", "more words here"], ["x", "y"], 1.0, 0.0, 0.5)
    empty = PreferencePair(["p1", "p2"], ["a long answer", "more"], ["", " "], 1.0, 0.0, 0.5)
    cb = LearnedRewardFit()
    with pytest.warns(UserWarning, match="1 of 2 preference pairs have a side whose completions are all empty"):
        model = cb.fit(trainer, module, [good, empty], seed=0)
    assert model is not None and cb.history[-1]["reward_model/num_pairs"] == 1
    with pytest.warns(UserWarning):
        assert cb.fit(trainer, module, [empty], seed=0) is None


# --- the train_oracle hook -------------------------------------------------------------------------------


def test_train_oracle_replaces_the_task_reward_in_magrpo_training_only(tiny_model_dir):
    from comlrl_lightning.config.magrpo import MAGRPOConfig
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    args = MAGRPOConfig(num_train_epochs=1, num_generations=2, max_new_tokens=4, eval_interval=0, eval_num_samples=0)
    tr = MAGRPOTrainer(agent_model=str(tiny_model_dir), train_dataset=load_task_items("builtin:cooperative")[:2],
                       reward_func=cooperative_reward, formatters=FORMATTERS, args=args,
                       trainer_kwargs=cpu_trainer_kwargs())
    stub = StubRewardModel()
    tr.module.train_oracle = LearnedRewardOracle(stub, FORMATTERS)
    tr.train()
    assert stub.calls == 2 * 2  # one call per aligned joint sample, 2 items x 2 generations
    assert tr.trainer.callback_metrics["turn_1/reward_mean"] <= 0  # the stub's scale, not the task's


# --- reward_clip_quantile (docs/preference.md §8.5) ----------------------------------------------------------


def test_support_clip_bound_is_the_interpolated_quantile():
    from comlrl_lightning.reward_model import support_clip_bound

    scores = [4.0, 1.0, 3.0, 2.0, 10.0]  # sorted 1, 2, 3, 4, 10
    assert support_clip_bound(scores, 1.0) == 10.0
    assert support_clip_bound(scores, 0.5) == 3.0  # h = 2: the third order statistic
    assert support_clip_bound(scores, 0.9) == pytest.approx(4.0 + 0.6 * 6.0)  # h = 3.6 -> 4 + 0.6 (10 - 4)
    assert support_clip_bound([7.0], 0.3) == 7.0
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="quantile must be in"):
            support_clip_bound(scores, bad)


def test_clipped_oracle_caps_scores_in_both_call_styles():
    item = load_task_items("builtin:cooperative")[0]
    oracle = LearnedRewardOracle(StubRewardModel(), FORMATTERS, clip_max=-5.0)
    assert oracle.score([], ["ab", "c"], item, 0) == (-5.0, -5.0)  # stub: -3, capped at -5
    assert oracle.reward_func(["ab", "a long one"], ["c", "x"], batch_items=[item]) == [-5.0, -11.0]
    assert LearnedRewardOracle(StubRewardModel(), FORMATTERS).score([], ["ab", "c"], item, 0) == (-3.0, -3.0)


def test_fit_sets_the_clip_bound_from_the_fitted_models_scores_of_its_pairs(tiny_model_dir):
    from comlrl_lightning.callbacks import LearnedRewardFit
    from comlrl_lightning.modules.marlhf import MARLHFModule
    from comlrl_lightning.reward_model import support_clip_bound

    pairs = [PreferencePair(["p1", "p2"], ["short", "a much longer elaboration"], ["a long answer here", "x"], 1.0, 0.0, 0.5),
             PreferencePair(["p1", "p2"], ["tiny", "words words words words"], ["words", "w"], 1.0, 0.0, 0.5)]
    for q, expect_clip in ((None, False), (0.75, True)):
        module = MARLHFModule(agent_model=str(tiny_model_dir),
                              args=marlhf_args(reward_model_name=str(tiny_model_dir), reward_clip_quantile=q,
                                               reward_length_features="only"))
        cb = LearnedRewardFit(val_fraction=0)
        model = cb.fit(L.Trainer(**cpu_trainer_kwargs()), module, pairs, seed=0)
        if not expect_clip:
            assert cb.clip_max is None and cb.oracle(model, FORMATTERS).clip_max is None
            continue
        scores = model.score([p.prompts for p in pairs] * 2, [p.winner_completions for p in pairs]
                             + [p.loser_completions for p in pairs])
        assert cb.clip_max == pytest.approx(support_clip_bound(scores, 0.75))
        assert min(scores) < cb.clip_max < max(scores)
        assert cb.history[-1]["reward_model/clip_max"] == cb.clip_max
        assert cb.oracle(model, FORMATTERS).clip_max == cb.clip_max


@pytest.mark.parametrize("bad", [0, 1.2, -1, "high", float("nan"), True])
def test_reward_clip_quantile_out_of_range_is_a_clear_error(bad):
    with pytest.raises(ValueError, match=r"reward_clip_quantile must be in \(0, 1\] or null"):
        marlhf_args(reward_clip_quantile=bad)


# --- offline MARLHF ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["magrpo", "mareinforce", "marloo", "maremax", "iac", "maac"])
def test_every_backend_runs_a_few_steps_on_the_learned_reward(tiny_model_dir, alg):
    from comlrl_lightning.modules.marlhf import MARLHFActorCriticModule, MARLHFModule

    g = 2 if alg not in ("iac", "maac") else 1
    tr = make(tiny_model_dir, marlhf_args(rl_algorithm=alg, num_generations=g), n_items=2)
    before = [p.detach().clone() for p in tr.team.parameters_of(1)]
    metrics = tr.train()
    assert isinstance(tr.module, MARLHFActorCriticModule if alg in ("iac", "maac") else MARLHFModule)
    if alg not in ("iac", "maac"):
        assert tr.module.args.advantage_mode == {"magrpo": "mean", "mareinforce": "raw", "marloo": "rloo",
                                                 "maremax": "max"}[alg]
    assert isinstance(tr.module.train_oracle, LearnedRewardOracle)
    assert tr.module.train_oracle.reward_model is tr.reward_model
    assert tr.trainer.global_step > 0 and tr.module.env_step == 2 * g
    assert metrics["reward_model/fits"] == 1 and metrics["round/num_pairs"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.team.parameters_of(1)))


def test_no_pairs_means_no_reward_model_and_no_rl(tiny_model_dir, capsys):
    from comlrl_lightning.trainers.marlhf import MARLHFTrainer

    tr = MARLHFTrainer(agent_model=str(tiny_model_dir), train_dataset=load_task_items("builtin:cooperative")[:2],
                       reward_func=lambda a, b: [1.0] * len(a), formatters=FORMATTERS, args=marlhf_args(),
                       trainer_kwargs=cpu_trainer_kwargs())
    before = [p.detach().clone() for p in tr.team.parameters_of(0)]
    tr.train()
    assert tr.reward_model is None and tr.module.train_oracle is None
    assert all(torch.equal(a, b) for a, b in zip(before, tr.team.parameters_of(0)))


def test_evaluation_scores_with_the_task_reward_not_the_learned_one(tiny_model_dir, stub_fit):
    eval_items = load_task_items("builtin:cooperative_eval")
    tr = make(tiny_model_dir, marlhf_args(eval_num_samples=3), n_items=2, eval_dataset=eval_items)
    metrics = tr.train()
    assert stub_fit and isinstance(tr.module.train_oracle.reward_model, StubRewardModel)
    dm = tr.datamodule
    settings = tr.module.sampling_settings()
    # Recompute the final evaluation: same seeded streams, same (final) policies, task reward.
    bs = tr.module.args.eval_batch_size  # items generated together, as the evaluation did
    samples = tr.evaluation.samples_per_item  # the facade's, as its shipped config's
    task = evaluate_team(tr.team, eval_items[:3], dm.formatters, dm.oracle, settings, 12345, samples,
                         batch_size=bs)["eval/reward_mean"]
    assert metrics["eval/reward_mean"] == pytest.approx(task, abs=1e-6)
    learned = evaluate_team(tr.team, eval_items[:3], dm.formatters, tr.module.train_oracle, settings, 12345,
                            samples, batch_size=bs)["eval/reward_mean"]
    assert learned < 0 <= task and metrics["eval/reward_mean"] != pytest.approx(learned)
    assert metrics["turn_1/reward_mean"] < 0  # training saw the stub's rewards


# --- MARLHFIter -------------------------------------------------------------------------------------------


def test_a_fresh_reward_model_each_round(tiny_model_dir, tmp_path, monkeypatch):
    from comlrl_lightning.modules import reward_model as rm_module

    original = rm_module.fit_reward_model
    seen = []

    def recording_fit(model, pairs, **kw):
        seen.append((model, {k: v.detach().clone() for k, v in model.state_dict().items()}))
        out = original(model, pairs, **kw)
        seen[-1] += ({k: v.detach().clone() for k, v in model.state_dict().items()},)
        return out

    monkeypatch.setattr(rm_module, "fit_reward_model", recording_fit)
    args = iter_args(reward_model_name=str(tiny_model_dir))
    tr = make(tiny_model_dir, args, iterative=True, root=tmp_path)
    tr.train()
    assert len(seen) == 2
    (m0, init0, trained0), (m1, init1, _) = seen
    assert m0 is not m1
    assert not set(map(id, m0.parameters())) & set(map(id, m1.parameters()))
    fresh = rm_module.JointRewardModel(str(tiny_model_dir), args=args.reward_model_options(), seed=0 * 1000 + 1)
    for k, v in fresh.state_dict().items():
        assert torch.equal(init1[k], v), k  # round 1 starts from a fresh build ...
    assert any(not torch.equal(init1[k], trained0[k]) for k in init1)  # ... not from round 0's weights
    backbone = [k for k in init1 if k.startswith("backbone.")]
    assert all(torch.equal(init1[k], init0[k]) for k in backbone)  # same pretrained backbone
    assert not torch.equal(init1["head.weight"], init0["head.weight"])  # new head per round
    assert tr.reward_model is m1 and tr.module.train_oracle.reward_model is m1


class PairsPerRound(L.Callback):
    def __init__(self):
        self.rounds: dict[int, list] = {}

    def on_train_epoch_start(self, trainer, pl_module):
        self.rounds.setdefault(trainer.current_epoch, list(trainer.datamodule.new_pairs))


@pytest.mark.parametrize("scoring", ["reward_model", "task"])
def test_scoring_with_the_reward_model_from_round_one(tiny_model_dir, tmp_path, stub_fit, scoring):
    rec = PairsPerRound()
    tr = make(tiny_model_dir, iter_args(preference_scoring_reward=scoring, pair_selection="all",
                                        preference_pairs_per_sample=None), iterative=True, root=tmp_path,
              callbacks=[rec])
    tr.train()
    assert set(rec.rounds) == {0, 1} and rec.rounds[0] and rec.rounds[1]
    for r, pairs in rec.rounds.items():
        for p in pairs:
            task_w = cooperative_reward([p.winner_completions[0]], [p.winner_completions[1]])[0]
            stub_w = StubRewardModel.value(p.winner_completions)
            if r == 0 or scoring == "task":  # round 0 has no reward model yet: task reward
                assert p.winner_reward == pytest.approx(task_w) and p.winner_reward > p.loser_reward
            else:  # round 1 compares with round 0's (stub) reward model: shorter wins
                assert p.winner_reward == pytest.approx(stub_w) and p.raw_rewards[0] == pytest.approx(stub_w)
                assert sum(map(len, p.winner_completions)) < sum(map(len, p.loser_completions))
    assert len(stub_fit) == 2 and stub_fit[0] and stub_fit[1]


def test_marlhf_iter_actor_critic_backend_runs_rounds(tiny_model_dir, tmp_path, stub_fit):
    tr = make(tiny_model_dir, iter_args(rl_algorithm="iac", num_generations=1, use_separate_critic=False),
              iterative=True, root=tmp_path, n_items=2)
    tr.train()
    assert len(stub_fit) == 2 and tr.trainer.current_epoch == 2 and tr.module.env_step == 2 * 2
    assert tr.trainer.callback_metrics["turn_1/reward_mean"] < 0  # RL on the (stub) learned reward


def test_missing_reward_callback_is_a_clear_error(tiny_model_dir):
    from comlrl_lightning.data.task import TaskDataModule
    from comlrl_lightning.modules.marlhf import MARLHFModule

    module = MARLHFModule(agent_model=str(tiny_model_dir), args=marlhf_args())
    dm = TaskDataModule(train_dataset=load_task_items("builtin:cooperative")[:2], eval_dataset=None)
    with pytest.raises(ValueError, match="LearnedRewardFit"):
        L.Trainer(**cpu_trainer_kwargs(max_epochs=1)).fit(module, datamodule=dm)


# --- YAML configs -----------------------------------------------------------------------------------------

CLI_OVERRIDES = ["--trainer.enable_progress_bar=false", "--trainer.limit_train_batches=2",
                 "--model.init_args.args.preference_num_candidates=2", "--model.init_args.args.num_generations=2",
                 "--model.init_args.args.max_new_tokens=4", "--model.init_args.args.eval_num_samples=1"]


@pytest.mark.parametrize("name", ["tiny", "iterative_tiny"])
def test_cli_configs_print(name, capsys):
    from comlrl_lightning.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(ROOT / f"configs/marlhf/{name}.yaml"), "--print_config"])
    assert exc.value.code == 0
    assert "class_path: comlrl_lightning.modules.marlhf.MARLHFModule" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["tiny", "iterative_tiny"])
def test_cli_configs_run(name, tmp_path, monkeypatch, capsys):
    from comlrl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    items = tmp_path / "items.jsonl"
    import json

    items.write_text("\n".join(json.dumps(i) for i in load_task_items("builtin:cooperative")[:2]))
    main(["fit", "--config", str(ROOT / f"configs/marlhf/{name}.yaml"), *CLI_OVERRIDES,
          f"--data.init_args.train_dataset={items}"])
    assert "task reward (eval/reward_mean): before" in capsys.readouterr().out
    files = list(tmp_path.glob(f"outputs/marlhf_{name}/lightning_logs/version_*/metrics.csv"))
    assert files
    with open(files[0]) as fh:
        header = next(csv.reader(fh))
    for key in ("turn_1/reward_mean", "train/reward_model/accuracy", "reward_model/num_pairs", "eval/reward_mean",
                "round/num_pairs"):
        assert key in header
    # the fitted reward model and the agents are exported into the run's folder
    run = files[0].parent
    assert (run / "reward_model" / "head.pt").is_file() and (run / "agents" / "agent_1" / "README.md").is_file()


def test_reward_model_val_accuracy_is_logged_every_round(tiny_model_dir, tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    args = iter_args(reward_model_name=str(tiny_model_dir), reward_num_train_epochs=2)
    tr = make(tiny_model_dir, args, iterative=True, n_items=4, root=tmp_path)
    tr.trainer.loggers[:] = [CSVLogger(str(tmp_path), name="csv")]
    tr.train()
    assert [h["reward_model/fits"] for h in tr.reward_fit.history] == [1, 2]
    for h in tr.reward_fit.history:  # the default reward_val_fraction (0.1) holds out pairs at every fit
        assert 0.0 <= h["reward_model/val_accuracy"] <= 1.0
    rows = list(csv.DictReader(open(next(tmp_path.rglob("metrics.csv")))))
    assert sum(bool(r.get("reward_model/val_accuracy")) for r in rows) == 2


def test_kept_reward_model_is_the_best_epoch_on_held_out_pairs():
    from comlrl_lightning.callbacks.reward_model import _KeepBestValAccuracy

    model = torch.nn.Linear(1, 1)
    trainer = type("T", (), {"sanity_checking": False, "callback_metrics": {}})()
    keep = _KeepBestValAccuracy()
    for acc, w in ((0.5, 1.0), (0.75, 2.0), (0.6, 3.0)):
        torch.nn.init.constant_(model.weight, w)
        trainer.callback_metrics = {"val/reward_model/accuracy": torch.tensor(acc)}
        keep.on_validation_epoch_end(trainer, model)
    keep.on_fit_end(trainer, model)
    assert keep.best == 0.75 and model.weight.item() == 2.0
