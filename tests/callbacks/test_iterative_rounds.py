"""MADPOIterTrainer rounds as epochs: round files, metrics, empty rounds, setup errors, plain Trainer use.

The small builders shared with the other iterative tests live in ``iterative_helpers.py``.
"""

from __future__ import annotations

import json

import lightning as L
import pytest
from conftest import cpu_trainer_kwargs
from iterative_helpers import StepRecorder, _plain_parts, iter_args, make_trainer

from comlrl_lightning.callbacks import (
    ComparatorRefresh,
    HistoryCheckpoint,
    IterativePreferenceCollection,
    ReplaySelection,
)
from comlrl_lightning.files import json_digest
from comlrl_lightning.preferences import PAIR_FIELDS


def test_two_rounds_write_round_files_and_log_metrics(tiny_model_dir, tmp_path):
    rec = StepRecorder()
    tr = make_trainer(tiny_model_dir, tmp_path, callbacks=[rec])
    metrics = tr.train()
    assert tr.trainer.max_epochs == 2 and tr.trainer.current_epoch == 2
    for key in ("round/index", "round/num_pairs", "round/total_pairs", "round/replay_size", "round/win_rate",
                "round/tie_rate"):
        assert key in metrics
    assert metrics["round/index"] == 1
    hist = tr.collection.history
    assert [h["round/index"] for h in hist] == [0, 1]
    for h in hist:
        assert 0.0 <= h["round/win_rate"] <= 1.0 and 0.0 <= h["round/tie_rate"] <= 1.0
    replay = tmp_path / "preference_replay"
    assert sorted(p.name for p in replay.iterdir()) == ["iteration_0001.json", "iteration_0002.json"]
    total = 0
    for i, h in enumerate(hist, start=1):
        data = json.loads((replay / f"iteration_{i:04d}.json").read_text())
        assert set(data) == {"iteration", "num_pairs", "pairs", "sha256"}
        assert data["iteration"] == i and data["num_pairs"] == len(data["pairs"]) == h["round/num_pairs"]
        total += data["num_pairs"]
        for rec_ in data["pairs"]:
            assert set(rec_) == set(PAIR_FIELDS)
            assert len(rec_["prompts"]) == 2 and len(rec_["raw_rewards"]) == 2
            assert rec_["target_raw_reward"] is not None and rec_["comparator_raw_reward"] is not None
            assert rec_["winner_reward"] > rec_["loser_reward"]
            assert rec_["raw_rewards"] == [rec_["winner_reward"], rec_["loser_reward"]]  # no reward_processor
            assert {rec_["target_raw_reward"], rec_["comparator_raw_reward"]} == set(rec_["raw_rewards"])
            assert rec_["prompts"][0].endswith("Answer:") and rec_["prompts"][1].endswith("Elaboration:")
        # current mode trains exactly on the new pairs, in order
        assert rec.epoch_pairs[i - 1] == data["pairs"]
    assert metrics["round/total_pairs"] == total
    assert tr.module.round_index == 1
    assert {e for e, _ in rec.losses} == {0, 1}


def test_round_with_no_pairs_trains_nothing_and_fit_goes_on(tiny_model_dir, tmp_path):
    def flat(completions1, completions2):
        return [1.0] * len(completions1)

    rec = StepRecorder()
    tr = make_trainer(tiny_model_dir, tmp_path, reward_func=flat, callbacks=[rec])
    tr.train()
    assert tr.trainer.current_epoch == 2 and tr.trainer.global_step == 0 and rec.losses == []
    assert [h["round/tie_rate"] for h in tr.collection.history] == [1.0, 1.0]
    for i in (1, 2):
        data = json.loads((tmp_path / "preference_replay" / f"iteration_{i:04d}.json").read_text())
        assert data == {"iteration": i, "num_pairs": 0, "pairs": [], "sha256": json_digest([])}


def test_callbacks_in_a_plain_user_trainer(tiny_model_dir, tmp_path):
    args = iter_args(num_iterations=2, num_train_epochs=2, preference_replay_mode="all_history",
                     preference_replay_sample_size=5, policy_checkpoint_dir=str(tmp_path / "snaps"))
    module, dm = _plain_parts(tiny_model_dir, tmp_path, args)
    rec = StepRecorder()
    trainer = L.Trainer(callbacks=[HistoryCheckpoint(), ComparatorRefresh(), IterativePreferenceCollection(),
                                   ReplaySelection(), rec],
                        max_epochs=4, reload_dataloaders_every_n_epochs=1,
                        **cpu_trainer_kwargs(default_root_dir=str(tmp_path)))
    trainer.fit(module, datamodule=dm)
    assert sorted(p.name for p in (tmp_path / "replay").glob("iteration_*.json")) == [
        "iteration_0001.json", "iteration_0002.json"]
    # two epochs per round: epochs 0,1 train round 0's selection, epochs 2,3 round 1's (5 replayed pairs each)
    assert rec.epoch_pairs[0] == rec.epoch_pairs[1] and rec.epoch_pairs[2] == rec.epoch_pairs[3]
    assert len(rec.epoch_pairs[0]) == 5 and len(rec.epoch_pairs[2]) == 5
    snaps = sorted(p.name for p in (tmp_path / "snaps").iterdir() if not p.name.startswith("."))
    assert snaps == ["initial", "iteration_0000", "iteration_0001"]
    assert (tmp_path / "snaps" / "iteration_0001" / "agent_1" / "config.json").is_file()
    assert module.round_index == 1


def test_reload_flag_off_is_a_clear_error(tiny_model_dir, tmp_path):
    module, dm = _plain_parts(tiny_model_dir, tmp_path, iter_args())
    trainer = L.Trainer(callbacks=[IterativePreferenceCollection()], max_epochs=2,
                        **cpu_trainer_kwargs(default_root_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="reload_dataloaders_every_n_epochs=1"):
        trainer.fit(module, datamodule=dm)


def test_misordered_round_callbacks_are_a_clear_error(tiny_model_dir, tmp_path):
    module, dm = _plain_parts(tiny_model_dir, tmp_path, iter_args())
    trainer = L.Trainer(callbacks=[ReplaySelection(), IterativePreferenceCollection()], max_epochs=2,
                        reload_dataloaders_every_n_epochs=1, **cpu_trainer_kwargs(default_root_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="wrong order"):
        trainer.fit(module, datamodule=dm)


def test_iterative_yaml_parses_and_runs(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from comlrl_lightning.cli import main

    cfg = str(Path(__file__).resolve().parents[2] / "configs/madpo/iterative_tiny.yaml")
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", cfg, "--print_config"])
    assert exc.value.code == 0
    printed = capsys.readouterr().out
    assert "preference_replay_lambda: 0.8" in printed and "reload_dataloaders_every_n_epochs: 1" in printed
    monkeypatch.chdir(tmp_path)
    # a smaller copy of the config (dotted overrides of the args union are not reliable in jsonargparse)
    text = Path(cfg).read_text()
    for old, new in (("num_iterations: 3", "num_iterations: 2"), ("preference_num_candidates: 4",
                     "preference_num_candidates: 2"), ("max_new_tokens: 12", "max_new_tokens: 4"),
                     ("eval_num_samples: 8", "eval_num_samples: 1")):
        assert old in text
        text = text.replace(old, new)
    small = tmp_path / "small.yaml"
    small.write_text(text)
    main(["fit", "--config", str(small), "--trainer.enable_progress_bar=false"])
    out = tmp_path / "outputs/madpo_iterative_tiny"
    assert sorted(p.name for p in (out / "preference_replay").glob("iteration_*.json")) == [
        "iteration_0001.json", "iteration_0002.json"]
    assert (out / "policy_checkpoints/iteration_0001/agent_1").is_dir()


def test_replay_options_without_replay_selection_are_refused(tiny_model_dir, tmp_path):
    """Issue 14, finding 10: replay options that nothing would read are an error in setup, not ignored."""
    args = iter_args(preference_replay_mode="lambda_decay", preference_replay_lambda=0.5,
                     preference_replay_sample_size=4)
    module, dm = _plain_parts(tiny_model_dir, tmp_path, args)
    trainer = L.Trainer(callbacks=[IterativePreferenceCollection()], max_epochs=2, reload_dataloaders_every_n_epochs=1,
                        **cpu_trainer_kwargs(default_root_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="preference_replay_mode='lambda_decay'.*no ReplaySelection"):
        trainer.fit(module, datamodule=dm)


def test_comlrl_iter_metric_keys_are_logged_next_to_round_keys(tiny_model_dir, tmp_path):
    # CoMLRL's dashboards read iter/* (docs/coming-from-comlrl.md, "Metric keys")
    tr = make_trainer(tiny_model_dir, tmp_path)
    metrics = tr.train()
    assert metrics["iter/current_iteration"] == 2  # 1-based, the last round
    assert metrics["iter/current_preference_pairs"] == metrics["round/num_pairs"]
    assert metrics["iter/total_preference_pairs"] == metrics["round/total_pairs"]
    assert metrics["iter/train_preference_pairs"] == metrics["round/replay_size"]
