"""Task items from every source, formatters and prompt building, with errors that name the item."""

from __future__ import annotations

import json
import time

import pytest

from comlrl_lightning.data.sources import build_formatters, format_prompts, load_task_items
from comlrl_lightning.envs.cooperative import DATA_FILE

RECORDS = [
    {"id": 0, "prompt": "Add 1 and 2.", "answer": "3"},
    {"id": 1, "prompt": "Add 2 and 2.", "answer": "4"},
    {"id": 2, "prompt": "Add 3 and 4.", "answer": "7"},
]


def _shipped_records() -> list[dict]:
    return [json.loads(line) for line in DATA_FILE.read_text().splitlines() if line.strip()]


def test_builtin_train_and_eval():
    shipped = _shipped_records()
    assert len(shipped) > 8
    train = load_task_items("builtin:cooperative")
    evaluation = load_task_items("builtin:cooperative_eval")
    # The last 8 items are held out for evaluation, the rest is the train part, order kept.
    assert train == shipped[:-8]
    assert evaluation == shipped[-8:]
    for item in train + evaluation:
        assert isinstance(item, dict) and isinstance(item["prompt"], str) and item["prompt"]


def test_unknown_builtin():
    with pytest.raises(ValueError, match="Unknown built-in dataset 'builtin:nope'") as err:
        load_task_items("builtin:nope")
    assert "builtin:cooperative" in str(err.value)


def test_local_jsonl_json_and_csv(tmp_path):
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    assert load_task_items(str(jsonl)) == RECORDS

    as_json = tmp_path / "tasks.json"
    as_json.write_text(json.dumps(RECORDS))
    assert load_task_items(str(as_json)) == RECORDS

    csv = tmp_path / "tasks.csv"
    csv.write_text("prompt,answer\nAdd 1 and 2.,three\nAdd 2 and 2.,four\n")
    assert load_task_items(str(csv)) == [{"prompt": "Add 1 and 2.", "answer": "three"},
                                         {"prompt": "Add 2 and 2.", "answer": "four"}]

    txt = tmp_path / "tasks.txt"
    txt.write_text("Add 1 and 2.\n")
    with pytest.raises(ValueError, match="tasks.txt"):
        load_task_items(str(txt))


def test_list_of_dicts_and_dataset():
    from datasets import Dataset

    items = load_task_items(RECORDS)
    assert items == RECORDS
    assert all(a is not b for a, b in zip(items, RECORDS))  # copies: editing items leaves the input alone
    items[0]["prompt"] = "changed"
    assert RECORDS[0]["prompt"] == "Add 1 and 2."

    assert load_task_items(Dataset.from_list(RECORDS)) == RECORDS
    assert load_task_items(iter(RECORDS)) == RECORDS
    assert load_task_items(None) == []


def test_non_dict_items_and_unsupported_sources():
    with pytest.raises(ValueError, match="Dataset item 1"):
        load_task_items([{"prompt": "a"}, "just a string"])
    with pytest.raises(ValueError, match="Unsupported dataset source"):
        load_task_items(42)


def test_hub_name_offline_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(ValueError, match="comlrl-test-nobody/no-such-dataset") as err:
        load_task_items("comlrl-test-nobody/no-such-dataset", split="train")
    assert time.monotonic() - start < 10.0
    assert "HF_HUB_OFFLINE" in str(err.value)
    assert "local JSON/JSONL file" in str(err.value)


# --- formatters and prompts ---------------------------------------------------------------------------------

def test_default_formatter_reads_the_prompt_field():
    fmts = build_formatters(None, 2)
    assert len(fmts) == 2
    assert format_prompts(RECORDS[:2], fmts) == [["Add 1 and 2.", "Add 2 and 2."]] * 2
    q = build_formatters(None, 1, prompt_field="answer")
    assert format_prompts(RECORDS, q) == [["3", "4", "7"]]


def test_shared_and_per_agent_formatters():
    shared = build_formatters(lambda it: f"Q: {it['prompt']}", 3)
    assert len(shared) == 3 and len(set(map(id, shared))) == 1
    per_agent = build_formatters([lambda it: f"short {it['id']}", lambda it: f"long {it['id']}"], 2)
    assert format_prompts(RECORDS, per_agent) == [["short 0", "short 1", "short 2"],
                                                  ["long 0", "long 1", "long 2"]]


def test_formatter_list_of_wrong_length():
    with pytest.raises(ValueError, match="Number of formatters must match num_agents") as err:
        build_formatters([lambda it: "a"], 2)
    assert "got 1 formatters for 2 agents" in str(err.value)
    with pytest.raises(ValueError, match=r"formatters\[1\] is not callable"):
        build_formatters([lambda it: "a", "not callable"], 2)


def test_missing_prompt_field_names_item_and_field():
    items = [{"prompt": "fine"}, {"question": "no prompt here"}]
    with pytest.raises(ValueError) as err:
        format_prompts(items, build_formatters(None, 2), offset=10)
    msg = str(err.value)
    assert "Dataset item 11" in msg
    assert "'prompt'" in msg
    assert "question" in msg  # the keys the item does have


def test_formatter_must_return_a_nonempty_string():
    with pytest.raises(ValueError, match="Formatter of agent 1 returned '' for dataset item 0"):
        format_prompts(RECORDS[:1], [lambda it: "ok", lambda it: ""])
    with pytest.raises(ValueError, match="Formatter of agent 0 returned 3 for dataset item 2"):
        format_prompts(RECORDS, [lambda it: 3 if it["id"] == 2 else "x"])


def test_an_empty_dataset_file_is_an_error_naming_it(tmp_path):
    from comlrl_lightning.data.task import TaskDataModule

    empty = tmp_path / "items.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"items\.jsonl' holds no task item \(it is empty\)"):
        TaskDataModule(train_dataset=str(empty))


def test_the_data_module_refuses_a_transition_that_cannot_take_the_arguments():
    from comlrl_lightning.data.task import TaskDataModule

    with pytest.raises(ValueError, match="cannot be called as a transition"):
        TaskDataModule(external_transition=lambda only_one: only_one, num_agents=2)
