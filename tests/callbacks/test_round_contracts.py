"""The contracts between module, round data and round callbacks (comlrl_lightning.protocols).

Regression tests for two defects of the first version: a comparator given to IterativePreferenceCollection
was never prepared when ComparatorRefresh was listed too (the refresh callback built a second one), and
the CLI crashed after a fit when TaskRewardEvaluation was listed before the round callbacks.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import lightning as L
import pytest
from conftest import cpu_trainer_kwargs
from iterative_helpers import _plain_parts, iter_args, task_items

from comlrl_lightning.callbacks import (
    ComparatorRefresh,
    HistoryCheckpoint,
    IterativePreferenceCollection,
    ReplaySelection,
    TaskRewardEvaluation,
)
from comlrl_lightning.comparators.local import CurrentComparator
from comlrl_lightning.data.madpo import IterativePreferenceDataModule
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.protocols import Comparator, RoundData, TeamModule, check_protocol

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


class RecordingComparator(CurrentComparator):
    """The current policy as comparator, recording its life cycle."""

    def __init__(self):
        super().__init__(seed=5)
        self.calls: list[tuple] = []

    def prepare(self, round_index: int) -> None:
        self.calls.append(("prepare", round_index))
        super().prepare(round_index)

    def sample(self, prompts, num_candidates, items=None):
        self.calls.append(("sample", len(items)))
        return super().sample(prompts, num_candidates, items)

    def release(self) -> None:
        self.calls.append(("release",))
        super().release()


INSTANCES: list = []


class SharedRecordingComparator(RecordingComparator):
    """Built by the CLI from YAML; every instance is kept so the test can look at it."""

    def __init__(self, seed: int = 5):
        super().__init__()
        INSTANCES.append(self)


def _fit(module, dm, callbacks, tmp_path, epochs=2):
    trainer = L.Trainer(callbacks=callbacks, max_epochs=epochs, reload_dataloaders_every_n_epochs=1,
                        **cpu_trainer_kwargs(default_root_dir=str(tmp_path)))
    trainer.fit(module, datamodule=dm)
    return trainer


def test_a_comparator_given_to_the_collection_is_the_one_refreshed(tiny_model_dir, tmp_path):
    """README recipe: comparator passed to IterativePreferenceCollection, ComparatorRefresh listed too."""
    module, dm = _plain_parts(tiny_model_dir, tmp_path, iter_args(num_iterations=2))
    comp = RecordingComparator()
    _fit(module, dm, [ComparatorRefresh(), IterativePreferenceCollection(comparator=comp)], tmp_path)
    prepared = [c[1] for c in comp.calls if c[0] == "prepare"]
    assert prepared == [0, 1], comp.calls
    assert [c[0] for c in comp.calls] == ["prepare", "sample", "release", "prepare", "sample", "release"]
    assert dm.comparator is comp


def test_the_comparator_lives_under_data(tiny_model_dir, tmp_path):
    module, _ = _plain_parts(tiny_model_dir, tmp_path, iter_args(num_iterations=2))
    comp = RecordingComparator()
    dm = IterativePreferenceDataModule(train_dataset=task_items(4), eval_dataset=None, reward_func=cooperative_reward,
                                       formatters=FORMATTERS, num_agents=2, comparator=comp)
    _fit(module, dm, [ComparatorRefresh(), IterativePreferenceCollection()], tmp_path)
    assert [c[1] for c in comp.calls if c[0] == "prepare"] == [0, 1]
    assert sum(c[0] == "sample" for c in comp.calls) == 2


def test_two_different_comparators_are_refused(tiny_model_dir, tmp_path):
    module, _ = _plain_parts(tiny_model_dir, tmp_path, iter_args())
    dm = IterativePreferenceDataModule(train_dataset=task_items(4), eval_dataset=None, reward_func=cooperative_reward,
                                       formatters=FORMATTERS, num_agents=2, comparator=RecordingComparator())
    with pytest.raises(ValueError, match="Two different comparators.*data.init_args.comparator"):
        _fit(module, dm, [ComparatorRefresh(), IterativePreferenceCollection(comparator=RecordingComparator())],
             tmp_path)


def test_callbacks_write_no_module_attribute(tiny_model_dir, tmp_path):
    """A fit with every MADPOIter round callback leaves the module's attribute set unchanged."""
    args = iter_args(num_iterations=2, comparator_policy="history", preference_replay_mode="all_history")
    module, dm = _plain_parts(tiny_model_dir, tmp_path, args)
    before = set(vars(module))
    _fit(module, dm, [HistoryCheckpoint(), ComparatorRefresh(), IterativePreferenceCollection(), ReplaySelection(),
                      TaskRewardEvaluation(eval_interval=0)], tmp_path)
    assert set(vars(module)) - before == set()
    assert module.round_index == 1  # the module keeps its own round counter


def test_the_parts_satisfy_the_protocols(tiny_model_dir, tmp_path):
    module, dm = _plain_parts(tiny_model_dir, tmp_path, iter_args())
    check_protocol(module, TeamModule, "test", "module", "MADPOModule")
    check_protocol(dm, RoundData, "test", "data module", "IterativePreferenceDataModule")
    check_protocol(RecordingComparator(), Comparator, "test", "comparator", "CurrentComparator")
    with pytest.raises(TypeError, match=r"ReplaySelection needs a data module with `\w+` \(the RoundData protocol"):
        check_protocol(object(), RoundData, "ReplaySelection", "data module", "IterativePreferenceDataModule")


ROUND = [HistoryCheckpoint, ComparatorRefresh, IterativePreferenceCollection, ReplaySelection]


WRONG_ORDERS = [o for o in itertools.permutations(range(4)) if list(o) != sorted(o)]


@pytest.mark.parametrize("order", WRONG_ORDERS)
def test_every_wrong_order_of_the_round_callbacks_names_the_right_one(order, tiny_model_dir, tmp_path):
    """Checked in setup, before anything runs. The right order, with the evaluation first or last, is run by
    test_cli_with_the_evaluation_listed_first and test_callbacks_write_no_module_attribute."""
    cbs = [TaskRewardEvaluation()] + [ROUND[i]() for i in order]
    module, dm = _plain_parts(tiny_model_dir, tmp_path, iter_args(comparator_policy="history"))
    trainer = L.Trainer(callbacks=cbs, max_epochs=2, reload_dataloaders_every_n_epochs=1,
                        **cpu_trainer_kwargs(default_root_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="must be listed as: HistoryCheckpoint, ComparatorRefresh, "
                                         "IterativePreferenceCollection, ReplaySelection"):
        trainer.fit(module, datamodule=dm)


def _small_iterative_yaml(tmp_path, callbacks_block: str) -> Path:
    text = (CONFIGS / "madpo/iterative_tiny.yaml").read_text()
    for old, new in (("num_iterations: 3", "num_iterations: 2"), ("preference_num_candidates: 4",
                     "preference_num_candidates: 2"), ("max_new_tokens: 12", "max_new_tokens: 4"),
                     ("eval_num_samples: 8", "eval_num_samples: 1")):
        assert old in text
        text = text.replace(old, new)
    start = text.index("  callbacks:\n")
    end = text.index("model:\n")
    text = text[:start] + callbacks_block + text[end:]
    items = tmp_path / "items.jsonl"
    import json

    items.write_text("".join(json.dumps(it) + "\n" for it in task_items(4)))
    text = text.replace("train_dataset: builtin:cooperative\n", f"train_dataset: {items}\n")
    path = tmp_path / "small.yaml"
    path.write_text(text)
    return path


def test_cli_with_the_evaluation_listed_first(tmp_path, monkeypatch, capsys):
    """The CLI finds the evaluation callback by type, wherever it stands (it crashed with KeyError: 1)."""
    from comlrl_lightning.cli import main

    block = """  callbacks:
    - class_path: comlrl_lightning.callbacks.TaskRewardEvaluation
    - class_path: comlrl_lightning.callbacks.HistoryCheckpoint
    - class_path: comlrl_lightning.callbacks.ComparatorRefresh
    - class_path: comlrl_lightning.callbacks.IterativePreferenceCollection
    - class_path: comlrl_lightning.callbacks.ReplaySelection
"""
    cfg = _small_iterative_yaml(tmp_path, block)
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(cfg), "--trainer.enable_progress_bar=false"])
    assert "task reward (eval/reward_mean): before" in capsys.readouterr().out


def test_a_yaml_comparator_under_data_is_shared(tmp_path, monkeypatch):
    """One comparator configured under data: is the one every round callback uses."""
    import yaml

    from comlrl_lightning.cli import main

    block = """  callbacks:
    - class_path: comlrl_lightning.callbacks.ComparatorRefresh
    - class_path: comlrl_lightning.callbacks.IterativePreferenceCollection
"""
    cfg = _small_iterative_yaml(tmp_path, block)
    conf = yaml.safe_load(cfg.read_text())
    conf["data"]["init_args"]["comparator"] = {"class_path": "test_round_contracts.SharedRecordingComparator",
                                               "init_args": {"seed": 3}}
    conf["model"]["init_args"]["args"]["comparator_policy"] = "current"
    del conf["model"]["init_args"]["args"]["comparator_history_k"]
    for name in ("preference_replay_mode", "preference_replay_lambda", "preference_replay_sample_size"):
        conf["model"]["init_args"]["args"].pop(name, None)  # no ReplaySelection here: replay options are refused
    cfg.write_text(yaml.safe_dump(conf))
    monkeypatch.chdir(tmp_path)
    INSTANCES.clear()
    main(["fit", "--config", str(cfg), "--trainer.enable_progress_bar=false"])
    assert len(INSTANCES) == 1
    assert [c[1] for c in INSTANCES[0].calls if c[0] == "prepare"] == [0, 1]
    assert sum(c[0] == "sample" for c in INSTANCES[0].calls) == 2
