"""Code problems in HumanEval format (``task_id``, ``prompt``, ``test``, ``entry_point``).

``load_code_problems()`` returns the 25 small built-in problems (``data/problems.jsonl``, written
for this project; each also has a ``canonical_solution`` body). ``source`` may instead be a local
HumanEval-format ``.json``/``.jsonl`` file or a dataset name on the Hugging Face Hub (for example
``"openai/openai_humaneval"`` with ``split="test"``).
"""

from __future__ import annotations

import os
from pathlib import Path

BUILTIN_PROBLEMS = Path(__file__).with_name("data") / "problems.jsonl"
REQUIRED_FIELDS = ("prompt", "test", "entry_point")
_TRUE = {"1", "true", "yes", "on"}


def _offline() -> bool:
    return any(
        os.environ.get(k, "").strip().lower() in _TRUE for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def validate_problems(rows, source: str = "dataset") -> None:
    """Raise ValueError naming the first row that lacks a non-empty string prompt/test/entry_point."""
    for index, row in enumerate(rows):
        for name in REQUIRED_FIELDS:
            value = row.get(name)
            if not isinstance(value, str) or not value.strip():
                problem = "is missing field" if value is None else "has an empty or non-string field"
                raise ValueError(
                    f"row {index} of {source} {problem} {name!r}; every code problem needs "
                    f"{', '.join(REQUIRED_FIELDS)} (HumanEval format)"
                )


def load_code_problems(
    source: str | os.PathLike | None = None, split: str = "train", *, cache_dir: str | None = None
):
    """Load code problems as a ``datasets.Dataset``.

    ``source``: None for the built-in problems; a path to a ``.json``/``.jsonl`` file; or a Hub
    dataset name. ``split`` accepts the ``datasets`` slice syntax (``"train[:10]"``); a local
    file has a single split named ``train``. ``cache_dir`` is passed to ``datasets``. With
    ``HF_HUB_OFFLINE=1`` (or ``HF_DATASETS_OFFLINE=1``) a Hub name fails at once instead of
    trying the network.
    """
    import datasets

    if source is None:
        source = BUILTIN_PROBLEMS
    path = Path(source).expanduser()
    is_file = path.suffix.lower() in {".json", ".jsonl"} or path.exists()
    if is_file:
        if not path.is_file():
            raise FileNotFoundError(f"code problems file not found: {str(path)!r}")
        if not split.split("[", 1)[0] == "train":
            raise ValueError(
                f"split={split!r}: a local problems file has a single split 'train' "
                "(slices like 'train[:10]' work)"
            )
        ds = datasets.load_dataset("json", data_files={"train": str(path)}, split=split, cache_dir=cache_dir)
        label = str(path)
    else:
        name = str(source)
        if _offline():
            raise RuntimeError(
                f"cannot load code problems {name!r} from the Hugging Face Hub: offline mode is on "
                "(HF_HUB_OFFLINE / HF_DATASETS_OFFLINE). Pass a local .json/.jsonl file instead, or "
                "unset the variable."
            )
        ds = datasets.load_dataset(name, split=split, cache_dir=cache_dir)
        label = f"{name} ({split})"
    validate_problems(ds, label)
    return ds
