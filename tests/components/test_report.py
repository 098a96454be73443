"""``comlrl-lightning report``: picks the training run below a folder (not a later validate/test run or an empty
one) and titles each plot by what it shows; losses of different kinds get their own panels."""

from __future__ import annotations

import os

from comlrl_lightning.report import find_metrics, plot_plan, read_metrics, render_report


def _csv(path, header, rows, mtime):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(",".join(header) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    os.utime(path, (mtime, mtime))
    return path


def _runs(tmp_path):
    logs = tmp_path / "outputs" / "madpo_tiny" / "lightning_logs"
    train = _csv(logs / "version_0" / "metrics.csv", ["step", "train/loss", "turn_1/reward_mean", "eval/reward_mean"],
                 [[0, 0.7, 0.9, ""], [1, 0.6, 1.0, 1.1], [2, 0.5, 1.1, ""]], 1_000_000)
    _csv(logs / "version_1" / "metrics.csv", ["step", "val/reward_mean"], [[0, 1.2]], 2_000_000)  # validate
    _csv(logs / "version_2" / "metrics.csv", ["step"], [], 3_000_000)  # a run stopped before logging
    return train


def test_the_training_run_is_picked_not_a_later_validate_or_empty_run(tmp_path):
    train = _runs(tmp_path)
    assert find_metrics(tmp_path / "outputs" / "madpo_tiny") == train
    assert find_metrics(tmp_path / "outputs") == train
    validate = train.parent.parent / "version_1"
    assert find_metrics(validate) == validate / "metrics.csv"  # a run folder named directly is used as given


def test_reward_titles_say_what_is_plotted():
    madpo = {"train/loss": [(0, 1.0)], "turn_1/reward_mean": [(0, 0.9)], "turn_1/expected_return": [(0, 0.9)]}
    (title, _, keys), = plot_plan(madpo)["rewards.png"]
    assert len(keys) == 1 and keys[0].startswith("turn_1/") and "training samples" in title and "eval" not in title
    with_eval = {**madpo, "eval/reward_mean": [(0, 1.1)], "round/candidate_reward_mean": [(0, 0.8)]}
    (title, _, keys), = plot_plan(with_eval)["rewards.png"]
    assert keys[0] == "eval/reward_mean" and "eval items (eval/reward_mean)" in title
    assert "round's sampled candidates (round/candidate_reward_mean)" in title


def test_each_kind_of_loss_has_its_own_panel():
    iac = {"train/agent0/actor_loss": [(0, 0.01)], "train/agent1/actor_loss": [(0, 0.02)],
           "train/agent0/value_loss": [(0, 40.0)], "train/agent1/value_loss": [(0, 35.0)],
           "train/accuracy": [(0, 0.5)]}
    panels = plot_plan(iac)["losses.png"]
    assert [(label, keys) for _, label, keys in panels] == [
        ("actor_loss", ["train/agent0/actor_loss", "train/agent1/actor_loss"]),
        ("value_loss", ["train/agent0/value_loss", "train/agent1/value_loss"]),
        ("accuracy", ["train/accuracy"])]


def test_report_of_a_folder_plots_the_training_run(tmp_path):
    train = _runs(tmp_path)
    written = render_report(tmp_path / "outputs" / "madpo_tiny", tmp_path / "plots")
    assert sorted(p.name for p in written) == ["losses.png", "rewards.png"]
    assert all(p.stat().st_size > 1000 for p in written)
    assert set(read_metrics(train)) == {"train/loss", "turn_1/reward_mean", "eval/reward_mean"}
