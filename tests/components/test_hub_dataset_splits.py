"""A hub dataset name may carry CoMLRL's split and slice (``OpenMLRL/CoopHumanEval:train[16:]``, data/sources.py):
the name and the split reach ``datasets.load_dataset`` apart; without one, the split of the role (train/test)."""

from __future__ import annotations

import pytest

from comlrl_lightning.data.sources import load_task_items


@pytest.fixture
def calls(monkeypatch):
    import datasets

    seen = []

    def fake_load_dataset(name, split=None, **_):
        seen.append((name, split))
        return [{"prompt": f"{name}:{split}"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    return seen


@pytest.mark.parametrize("source, split, expected", [
    ("OpenMLRL/CoopHumanEval:train[16:]", "train", ("OpenMLRL/CoopHumanEval", "train[16:]")),
    ("OpenMLRL/CoopHumanEval:train[:16]", "test", ("OpenMLRL/CoopHumanEval", "train[:16]")),
    ("ryankamiri/MBPP:test", "train", ("ryankamiri/MBPP", "test")),
    ("openai/openai_humaneval", "test", ("openai/openai_humaneval", "test")),
])
def test_the_split_after_the_colon_is_the_split_loaded(calls, source, split, expected):
    assert load_task_items(source, split) == [{"prompt": f"{expected[0]}:{expected[1]}"}]
    assert calls == [expected]


def test_offline_error_names_the_source(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match=r"Cannot load dataset 'no-such-org/no-such-set' \(split 'train\[16:\]'\).*"
                                         r"HF_HUB_OFFLINE is set"):
        load_task_items("no-such-org/no-such-set:train[16:]")
