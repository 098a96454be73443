"""JointRewardModel: text template, pooling, Bradley-Terry training, fresh models, options, bad input."""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from conftest import cpu_trainer_kwargs
from torch import nn

from comlrl_lightning.agents import load_model, load_tokenizer
from comlrl_lightning.config.reward_model import RewardModelOptions
from comlrl_lightning.data.reward_model import RewardPairDataModule, length_preference_pairs, load_pairs
from comlrl_lightning.losses import bradley_terry_loss
from comlrl_lightning.modules.reward_model import JointRewardModel, fit_reward_model
from comlrl_lightning.preferences import PreferencePair
from comlrl_lightning.reward_model import (
    joint_reward_text,
    last_token_pool,
    prompt_part_length,
    response_length_features,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny matmuls run far faster on one thread than on oversubscribed shared cores."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def opts(**kw) -> RewardModelOptions:
    base = {"reward_learning_rate": 1e-2, "reward_train_batch_size": 4, "reward_num_train_epochs": 1}
    base.update(kw)
    return RewardModelOptions(**base)


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# --- text template and pooling ------------------------------------------------------------------------------

def test_joint_text_matches_spec_example():
    assert joint_reward_text(["pa", "pb"], ["ca", "cb"]) == (
        "Joint multi-agent response\n\nAgent 1 prompt:\npa\n\nAgent 1 response:\nca\n\n"
        "Agent 2 prompt:\npb\n\nAgent 2 response:\ncb"
    )


def test_joint_text_missing_entries_become_empty_and_agents_are_one_based():
    text = joint_reward_text(["p1", None], ["c1", "c2", "c3"])
    assert text == (
        "Joint multi-agent response\n\nAgent 1 prompt:\np1\n\nAgent 1 response:\nc1\n\nAgent 2 prompt:\n\n\n"
        "Agent 2 response:\nc2\n\nAgent 3 prompt:\n\n\nAgent 3 response:\nc3"
    )
    assert joint_reward_text([], []) == "Joint multi-agent response"


def test_last_token_pool_left_right_and_no_padding():
    hidden = torch.arange(4 * 5 * 2, dtype=torch.float32).reshape(4, 5, 2)
    mask = torch.tensor([
        [0, 0, 1, 1, 1],  # left padded -> 4
        [1, 1, 1, 0, 0],  # right padded -> 2
        [1, 1, 1, 1, 1],  # no padding -> 4
        [1, 0, 0, 0, 0],  # one token, right padded -> 0
    ])
    pooled = last_token_pool(hidden, mask)
    assert torch.equal(pooled, torch.stack([hidden[0, 4], hidden[1, 2], hidden[2, 4], hidden[3, 0]]))
    # the old (sum(mask) - 1) rule would pick position 2 for the left-padded row
    assert not torch.equal(pooled[0], hidden[0, 2])
    with pytest.raises(ValueError, match=r"row\(s\) \[1\] have no non-padding token"):
        last_token_pool(hidden[:2], torch.tensor([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0]]))
    with pytest.raises(ValueError, match="hidden \\[B, T, H\\]"):
        last_token_pool(hidden, mask[:, :3])


def test_scores_do_not_depend_on_padding_side_or_batch(tiny_model_dir, tok):
    model = JointRewardModel(tiny_model_dir, tokenizer=copy.deepcopy(tok), seed=0).eval()
    short = joint_reward_text(["Topic: owls."], ["owls"])
    long = joint_reward_text(["Topic: owls."], ["owls fly at night and sleep in the day " * 3])
    with torch.no_grad():
        alone = model([short]).item()
        for side in ("left", "right"):
            model.tokenizer.padding_side = side
            assert model([short, long])[0].item() == pytest.approx(alone, abs=1e-5)


# --- Bradley-Terry ------------------------------------------------------------------------------------------

class StubBackbone(nn.Module):
    """hidden state = token id * scale, so with head weight 1 and bias 0 the reward is the last token id."""

    def __init__(self, config=None):
        super().__init__()
        self.config = config if config is not None else SimpleNamespace(hidden_size=1)
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, input_ids, attention_mask, position_ids=None, use_cache=False):
        return SimpleNamespace(last_hidden_state=(input_ids.float() * self.scale).unsqueeze(-1))


def test_training_step_is_bradley_terry_on_a_hand_made_batch(tok):
    model = JointRewardModel(StubBackbone(), tokenizer=tok)
    with torch.no_grad():
        model.head.weight.fill_(1.0)
        model.head.bias.zero_()
    batch = {  # chosen rows 0-1, rejected rows 2-3; pooled ids 3, 1 | 1, 2
        "input_ids": torch.tensor([[0, 3], [5, 1], [0, 1], [2, 9]]),
        "attention_mask": torch.tensor([[0, 1], [1, 1], [0, 1], [1, 0]]),
        "pair_index": torch.tensor([0, 1]),
    }
    with pytest.warns(UserWarning, match="self.log"):  # no trainer attached: logging is skipped
        loss = model.training_step(batch, 0)
    expected = (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(1.0))) / 2  # margins 3-1=2, 1-2=-1
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    assert model.head.weight.grad is not None and model.backbone.scale.grad is not None


def test_one_forward_over_both_sides_equals_two_separate_batches(tiny_model_dir, tok):
    model = JointRewardModel(tiny_model_dir, tokenizer=tok, seed=0)
    pairs = length_preference_pairs(3, seed=1)
    dm = RewardPairDataModule(pairs, tokenizer=tok, batch_size=3)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    with pytest.warns(UserWarning, match="self.log"):
        loss = model.training_step(batch, 0)
    order = batch["pair_index"].tolist()
    chosen = model([joint_reward_text(pairs[i].prompts, pairs[i].winner_completions) for i in order])
    rejected = model([joint_reward_text(pairs[i].prompts, pairs[i].loser_completions) for i in order])
    assert loss.item() == pytest.approx(bradley_terry_loss(chosen, rejected).mean().item(), abs=1e-5)


# --- learning -----------------------------------------------------------------------------------------------

def test_reward_model_learns_longer_answer_wins_on_held_out_pairs(tiny_model_dir, capsys):
    L.seed_everything(0)
    pairs = length_preference_pairs(200, seed=0)
    train, held_out = pairs[:160], pairs[160:]
    model = JointRewardModel(tiny_model_dir, args=opts(reward_learning_rate=3e-3, reward_train_batch_size=16),
                             seed=0)
    trainer = L.Trainer(**cpu_trainer_kwargs())
    before = trainer.validate(model, datamodule=RewardPairDataModule(train, held_out), verbose=False)
    before = before[0]["val/reward_model/accuracy"]
    start = time.perf_counter()
    metrics = fit_reward_model(model, train, held_out, trainer_kwargs=cpu_trainer_kwargs())
    seconds = time.perf_counter() - start
    after = metrics["val/reward_model/accuracy"]
    with capsys.disabled():
        print(f"\nheld-out accuracy {before:.3f} -> {after:.3f}; 10 steps of 16 pairs in {seconds:.1f} s")
    assert after >= 0.9
    assert after - before >= 0.2
    assert metrics["val/reward_model/margin"] > 0
    assert not model.training  # eval mode afterwards, as upstream
    # the trained model ranks fresh pairs through score()
    fresh = length_preference_pairs(10, seed=99)
    win = model.score([p.prompts for p in fresh], [p.winner_completions for p in fresh])
    lose = model.score([p.prompts for p in fresh], [p.loser_completions for p in fresh])
    assert sum(w > lo for w, lo in zip(win, lose)) >= 9


def test_logged_metric_names_with_and_without_eval_pairs(tiny_model_dir):
    pairs = length_preference_pairs(8, seed=2)
    model = JointRewardModel(tiny_model_dir, args=opts(), seed=0)
    metrics = fit_reward_model(model, pairs, trainer_kwargs=cpu_trainer_kwargs(max_steps=1))
    assert set(metrics) == {f"train/reward_model/{k}" for k in ("loss", "accuracy", "margin")}
    dm = RewardPairDataModule(pairs, val_fraction=0.25)
    assert (len(dm.train_pairs), len(dm.eval_pairs)) == (6, 2)
    trainer = L.Trainer(max_epochs=1, **cpu_trainer_kwargs())
    trainer.fit(model.fresh(), datamodule=dm)
    assert {"val/reward_model/loss", "val/reward_model/accuracy", "val/reward_model/margin"} <= set(
        trainer.callback_metrics)
    assert trainer.global_step == 2  # reward_train_batch_size=4 from args: 6 pairs -> 2 steps


def test_val_fraction_holds_out_whole_prompt_sets():
    # Pairs of one prompt share its few candidates: held-out pairs must not share prompts with train pairs.
    pairs = [PreferencePair([f"Topic: {t}.", f"Topic: {t}!"], [f"w{t}{j}", "x"], [f"l{t}", "y"], 1.0, 0.0, 0.5)
             for t in range(10) for j in range(4)]
    dm = RewardPairDataModule(pairs, val_fraction=0.2, seed=3)
    assert (len(dm.train_pairs), len(dm.eval_pairs)) == (32, 8)
    assert not {tuple(p.prompts) for p in dm.train_pairs} & {tuple(p.prompts) for p in dm.eval_pairs}
    one_prompt = [PreferencePair(["a", "b"], [f"w{j}", "x"], ["l", "y"], 1.0, 0.0, 0.5) for j in range(4)]
    dm = RewardPairDataModule(one_prompt, val_fraction=0.25)
    assert (len(dm.train_pairs), len(dm.eval_pairs)) == (3, 1)  # a single prompt set: single pairs


# --- fresh model per round ----------------------------------------------------------------------------------

def test_fresh_model_shares_nothing_with_the_trained_one(tiny_model_dir):
    pairs = length_preference_pairs(8, seed=3)
    model = JointRewardModel(tiny_model_dir, args=opts(), seed=7)
    trainer = L.Trainer(max_epochs=1, **cpu_trainer_kwargs())
    trainer.fit(model, datamodule=RewardPairDataModule(pairs))
    trained = params(model)
    old_tensors = list(model.parameters())  # keep them alive, so no storage can be reused
    reference = params(JointRewardModel(tiny_model_dir, args=opts(), seed=7))

    fresh = model.fresh()
    fresh_params = params(fresh)
    assert fresh_params.keys() == reference.keys() == trained.keys()
    assert all(torch.equal(fresh_params[n], reference[n]) for n in reference)
    assert not torch.equal(fresh_params["head.weight"], trained["head.weight"])
    changed = [n for n in trained
               if n.startswith("backbone.") and not torch.equal(trained[n], fresh_params[n])]
    assert changed  # the trained backbone moved, the fresh one is the pretrained one
    old_ptrs = {p.data_ptr() for p in old_tensors}
    assert not old_ptrs & {p.data_ptr() for p in fresh.parameters()}
    # optimizer state: the old optimizer holds only old tensors; a new fit builds a new one
    state_ids = {id(p) for p in trainer.optimizers[0].state}
    assert state_ids and not state_ids & {id(p) for p in fresh.parameters()}
    assert fresh._trainer is None
    assert {id(p) for p in fresh.configure_optimizers().param_groups[0]["params"]} == {
        id(p) for p in fresh.parameters()}

    model.reinitialize()  # in place: same result, new tensors
    assert all(torch.equal(p, reference[n]) for n, p in params(model).items())
    assert not old_ptrs & {p.data_ptr() for p in model.parameters()}
    other = model.fresh(seed=8)
    assert not torch.equal(other.head.weight, model.head.weight)


def test_model_object_source_is_copied_and_never_trained(tiny_model_dir, tok):
    source = load_model(tiny_model_dir)
    before = params(source)
    model = JointRewardModel(source, tokenizer=tok, args=opts(), seed=0)
    fit_reward_model(model, length_preference_pairs(4, seed=4), trainer_kwargs=cpu_trainer_kwargs())
    assert all(torch.equal(p, before[n]) for n, p in params(source).items())
    fresh = model.fresh()
    assert torch.equal(fresh.backbone.embed_tokens.weight, before["model.embed_tokens.weight"])
    assert not torch.equal(model.backbone.embed_tokens.weight, before["model.embed_tokens.weight"])


# --- what trains --------------------------------------------------------------------------------------------

def test_freeze_backbone_trains_only_the_head(tiny_model_dir):
    model = JointRewardModel(tiny_model_dir, args=opts(reward_freeze_backbone=True), seed=0)
    assert {id(p) for p in model.configure_optimizers().param_groups[0]["params"]} == {
        id(model.head.weight), id(model.head.bias)}
    before = params(model)
    fit_reward_model(model, length_preference_pairs(8, seed=5), trainer_kwargs=cpu_trainer_kwargs())
    after = params(model)
    assert all(torch.equal(after[n], before[n]) for n in before if n.startswith("backbone."))
    assert not torch.equal(after["head.weight"], before["head.weight"])


def test_lora_trains_only_the_adapter_and_the_head(tiny_model_dir):
    lora = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    model = JointRewardModel(tiny_model_dir, args=opts(), lora=lora, seed=0)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n.startswith("head.") for n in trainable)
    before = params(model)
    fit_reward_model(model, length_preference_pairs(8, seed=6), trainer_kwargs=cpu_trainer_kwargs())
    after = params(model)
    for n in before:
        assert torch.equal(after[n], before[n]) == (n not in trainable), n
    assert params(model.fresh()).keys() == before.keys()
    with pytest.raises(ValueError, match="reward_freeze_backbone=True cannot be combined with lora"):
        JointRewardModel(tiny_model_dir, args=opts(reward_freeze_backbone=True), lora=lora)


# --- options and bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("option, value, message", [
    ("reward_learning_rate", 0.0, "reward_learning_rate must be > 0. Got 0.0. Allowed: finite numbers > 0."),
    ("reward_learning_rate", float("nan"), "reward_learning_rate must be > 0. Got nan."),
    ("reward_num_train_epochs", 0, "reward_num_train_epochs must be >= 1. Got 0. Allowed: integers >= 1."),
    ("reward_train_batch_size", 0, "reward_train_batch_size must be >= 1. Got 0. Allowed: integers >= 1."),
    ("reward_max_length", 0, "reward_max_length must be >= 1 or null. Got 0. Allowed: integers >= 1 or null"),
    ("reward_freeze_backbone", "yes", "reward_freeze_backbone must be a bool. Got 'yes'."),
    ("reward_model_name", 3, "reward_model_name must be a string"),
])
def test_options_are_validated(option, value, message):
    with pytest.raises(ValueError) as err:
        RewardModelOptions(**{option: value})
    assert str(err.value).startswith(message)


def test_options_defaults_follow_the_spec():
    o = RewardModelOptions()
    assert (o.reward_model_name, o.reward_learning_rate, o.reward_num_train_epochs, o.reward_train_batch_size,
            o.reward_max_length, o.reward_freeze_backbone) == (None, 1e-5, 1, 1, None, False)
    assert o.num_train_epochs == 1  # the CLI derives trainer.max_epochs from it


def test_source_and_tokenizer_errors(tiny_model_dir, tok):
    with pytest.raises(ValueError, match="reward_model_name must be provided"):
        JointRewardModel()
    with pytest.raises(ValueError, match="A tokenizer must be provided"):
        JointRewardModel(StubBackbone())
    with pytest.raises(ValueError, match="Could not infer reward model hidden size"):
        JointRewardModel(StubBackbone(SimpleNamespace(vocab_size=10)), tokenizer=tok)
    no_pad = copy.deepcopy(tok)
    no_pad.pad_token = None
    model = JointRewardModel(StubBackbone(), tokenizer=no_pad)
    assert model.tokenizer.pad_token == model.tokenizer.eos_token  # EOS is the pad
    neither = copy.deepcopy(tok)
    neither.pad_token = None
    neither.eos_token = None
    with pytest.raises(ValueError, match="neither a pad token nor an EOS token"):
        JointRewardModel(StubBackbone(), tokenizer=neither)
    assert JointRewardModel("embedded:tiny", seed=0).head.in_features == 64


def _pair(winner, loser, prompts=("Topic: owls.", "Topic: maps.")) -> PreferencePair:
    return PreferencePair(list(prompts), list(winner), list(loser), 1.0, 0.0, 0.5)


def test_pairs_with_an_empty_side_are_rejected_by_index(tok):
    pairs = length_preference_pairs(4, seed=7) + [_pair(["a b c", "d"], ["", "  "])]
    dm = RewardPairDataModule(pairs, tokenizer=tok)
    with pytest.raises(ValueError, match="train pair 4: every loser completion is empty"):
        dm.setup("fit")
    dm = RewardPairDataModule(pairs[:2], eval_pairs=[_pair(["", ""], ["x", "y"])], tokenizer=tok)
    with pytest.raises(ValueError, match="eval pair 0: every winner completion is empty"):
        dm.setup("fit")


def test_max_length_shorter_than_the_prompt_part_is_an_error(tiny_model_dir, tok):
    pairs = length_preference_pairs(3, seed=8)
    need = prompt_part_length(tok, pairs[1].prompts, 2)
    long_prompt = _pair(["x y", "z"], ["x", "y"], prompts=("Topic: owls. " * 20, "Topic: maps."))
    dm = RewardPairDataModule(pairs[:2] + [long_prompt], tokenizer=tok, max_length=need + 5)
    with pytest.raises(ValueError, match=rf"reward_max_length={need + 5} is too short for train pair 2"):
        dm.setup("fit")
    with pytest.warns(UserWarning, match="are truncated"):  # room for one response token: allowed
        RewardPairDataModule(pairs[1:2], tokenizer=tok, max_length=need + 1).setup("fit")
    with pytest.raises(ValueError, match=f"already takes {need} tokens"):
        RewardPairDataModule(pairs[1:2], tokenizer=tok, max_length=need).setup("fit")
    model = JointRewardModel(tiny_model_dir, tokenizer=tok, args=opts(reward_max_length=need), seed=0)
    with pytest.raises(ValueError, match="too short for joint response 0"):
        model.score([pairs[1].prompts], [pairs[1].winner_completions])


def test_long_texts_are_truncated_with_a_warning(tok):
    pairs = [_pair(["word " * 200, "b"], ["c", "d"])]
    dm = RewardPairDataModule(pairs, tokenizer=tok, max_length=128)
    with pytest.warns(UserWarning, match="1 of 2 train joint texts are longer than reward_max_length=128"):
        dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[1] == 128


def test_score_checks_and_restores_training_mode(tiny_model_dir, tok):
    model = JointRewardModel(tiny_model_dir, tokenizer=tok, seed=0)
    assert model.training
    prompts = [["pa", "pb"], ["pa", "pb"], ["pc", "pd"]]
    comps = [["ca", "cb"], ["", ""], ["cc", "cd"]]  # empty completions are fine for scoring
    scores = model.score(prompts, comps, batch_size=2)
    assert model.training and len(scores) == 3 and all(isinstance(s, float) for s in scores)
    model.eval()
    with torch.no_grad():
        direct = model([joint_reward_text(p, c) for p, c in zip(prompts, comps)])
    assert scores == pytest.approx(direct.tolist(), abs=1e-5)
    with pytest.raises(ValueError, match="2 prompt lists but 1 completion lists"):
        model.score(prompts[:2], comps[:1])
    with pytest.raises(TypeError, match="not one string"):
        model("a joint text")


# --- pair files and the config ------------------------------------------------------------------------------

def test_pairs_load_from_jsonl_and_replay_files(tmp_path):
    pairs = length_preference_pairs(3, seed=9)
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text("\n".join(json.dumps(p.to_json()) for p in pairs) + "\n")
    replay = tmp_path / "iteration_0001.json"
    replay.write_text(json.dumps({"iteration": 1, "num_pairs": 3, "pairs": [p.to_json() for p in pairs]}))
    for path in (jsonl, str(replay)):
        loaded = load_pairs(path)
        assert [p.winner_completions for p in loaded] == [p.winner_completions for p in pairs]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_pairs(tmp_path / "missing.jsonl")
    with pytest.raises(TypeError, match="pair 0 is a int"):
        load_pairs([3])


def test_tiny_config_fits_pairs_from_a_jsonl_file(tmp_path, monkeypatch):
    from comlrl_lightning.cli import main

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps(p.to_json()) for p in length_preference_pairs(20, seed=10)))
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(ROOT / "configs/reward_model/tiny.yaml"), "--data.train_pairs", str(pairs),
          "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"])
    rows = list((tmp_path / "outputs/reward_model_tiny").rglob("metrics.csv"))
    assert rows
    header = rows[0].read_text().splitlines()[0].split(",")
    assert {"train/reward_model/loss", "val/reward_model/accuracy"} <= set(header)


# --- length-aware head (reward_length_features) ---------------------------------------------------------------

def test_response_length_features_by_hand():
    # "ab " strips to 2 characters, "abcd" has 4; None and a missing third agent are empty
    x, y = math.log(3), math.log(5)
    assert response_length_features(["ab ", None], 3) == pytest.approx([x, x * x, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0])
    assert response_length_features(["ab ", "abcd"], 2) == pytest.approx([x, x * x, 0, y, y * y, 0, x * y])


def test_length_features_option_is_checked(tiny_model_dir, tok):
    with pytest.raises(ValueError, match="reward_length_features must be one of off, add, only") as e:
        opts(reward_length_features="yes")
    assert "'yes'" in str(e.value)
    with pytest.raises(ValueError, match="needs num_agents"):
        JointRewardModel(tiny_model_dir, tokenizer=tok, args=opts(reward_length_features="add"))
    model = JointRewardModel(tiny_model_dir, tokenizer=tok, args=opts(reward_length_features="add"), num_agents=2)
    with pytest.raises(ValueError, match="pass a tokenized batch with length_features"):
        model(["Joint multi-agent response"])


@pytest.mark.parametrize("mode", ["add", "only"])
def test_length_head_starts_at_zero_and_learns_longer_answer_wins(tiny_model_dir, tok, mode):
    pairs = length_preference_pairs(48, seed=4)
    held_out = length_preference_pairs(16, seed=5)
    plain = JointRewardModel(tiny_model_dir, tokenizer=tok, seed=0)
    model = JointRewardModel(tiny_model_dir, tokenizer=tok, seed=0, num_agents=2,
                             args=opts(reward_length_features=mode, reward_learning_rate=0.1, reward_num_train_epochs=2,
                                       reward_train_batch_size=16))
    prompts, wins = [p.prompts for p in held_out], [p.winner_completions for p in held_out]
    # zero-initialised length head: "add" scores like the plain model with the same seed, "only" gives 0
    expected = plain.score(prompts, wins) if mode == "add" else [0.0] * len(wins)
    assert model.score(prompts, wins) == pytest.approx(expected, abs=1e-5)
    metrics = fit_reward_model(model, pairs, held_out, trainer_kwargs=cpu_trainer_kwargs())
    assert metrics["val/reward_model/accuracy"] >= 0.9
    longer = [[f"{c} {c}" for c in p.winner_completions] for p in held_out]
    assert sum(a > b for a, b in zip(model.score(prompts, longer), model.score(prompts, wins))) >= 12
    assert model.score(prompts, wins) != pytest.approx(expected, abs=1e-3)
