"""Checks shared by the facades (CoMLRL's constructor errors, docs/preference.md §2.7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def check_facade_inputs(agent_model: Any, agents: Any, reward_func: Any, train_dataset: Any) -> None:
    """Agents given one way or the other, a callable task reward, and task items."""
    if agent_model is None and agents is None:
        raise ValueError("Either agent_model or agents must be provided.")
    if not callable(reward_func):
        raise ValueError(f"reward_func must be a callable; got {type(reward_func).__name__}.")  # noqa: TRY004
    if train_dataset is None:
        raise ValueError("train_dataset is required (a datasets.Dataset, a list of dicts or a local file).")
    check_not_empty(train_dataset, "train_dataset")


def empty_dataset_message(source: Any, name: str = "the dataset") -> str:
    """What to say about a dataset that holds no task item."""
    return (f"{name} {source!r} holds no task item (an empty file or list). Give one task item per row "
            "(a JSONL line such as {\"prompt\": \"...\"}), a list of dicts or a datasets.Dataset.")


def check_not_empty(source: Any, name: str) -> None:
    """An empty local file or an empty list as ``name`` is an error naming it (the file loader alone fails with a
    bare StopIteration)."""
    from pathlib import Path

    if isinstance(source, (list, tuple)) and not source:
        raise ValueError(empty_dataset_message(source, name))
    if isinstance(source, str) and not source.startswith("builtin:") and Path(source).is_file():
        with open(source, "rb") as f:
            if not f.read(1 << 16).strip():
                raise ValueError(empty_dataset_message(source, name))


def sync_num_agents(args: Any, agents: Any, num_agents: int | None) -> None:
    """The one team-size rule of the facades that take ``num_agents``: ``args.num_agents`` is N, derived once.

    ``agents`` alone sets ``args.num_agents = len(agents)``; an explicit ``num_agents`` must equal
    ``args.num_agents`` (and ``len(agents)`` when both are given). Upstream MAGRPO instead let the constructor
    argument silently override ``args.num_agents``; here every facade rejects the disagreement.
    """
    if num_agents is None:
        if agents is not None:
            args.num_agents = len(agents)
        return
    if num_agents != args.num_agents:
        raise ValueError(f"num_agents ({num_agents}) must match args.num_agents ({args.num_agents}); set "
                         f"args.num_agents={num_agents}, or leave num_agents unset.")
    if agents is not None and len(agents) != num_agents:
        raise ValueError(f"agents length ({len(agents)}) must match num_agents ({num_agents}).")


def trainer_kwargs_for(max_epochs: int, args: Any, algorithm: str, wandb_config: dict | None,
                       trainer_kwargs: dict | None) -> dict[str, Any]:
    """``lightning.Trainer`` kwargs of a facade: quiet CPU/GPU defaults, a ``WandbLogger`` when
    ``wandb_config`` is given (and ``trainer_kwargs`` sets no logger), then the user's ``trainer_kwargs``; checkpoints
    are written atomically (:class:`~comlrl_lightning.checkpoint_io.AtomicCheckpointIO` joins ``plugins`` unless the
    user's plugins or strategy bring their own ``CheckpointIO``)."""
    from comlrl_lightning.checkpoint_io import with_atomic_checkpoint_io

    kwargs: dict[str, Any] = {"accelerator": "auto", "devices": 1, "logger": False, "enable_checkpointing": False,
                              "num_sanity_val_steps": 0, "log_every_n_steps": 1, "max_epochs": max_epochs}
    if wandb_config is not None and "logger" not in (trainer_kwargs or {}):
        kwargs["logger"] = wandb_logger(wandb_config, args, algorithm)
    kwargs.update(trainer_kwargs or {})
    kwargs["plugins"] = with_atomic_checkpoint_io(kwargs.get("plugins"), kwargs.get("strategy"),
                                                  kwargs.get("accelerator"))
    return kwargs


def wandb_logger(wandb_config: dict, args: Any, algorithm: str) -> Any:
    """A ``WandbLogger`` from CoMLRL's ``wandb_config`` keys (``project``, ``entity``, ``name``/``run_name``,
    ``dir``, ``tags``, ``id``, ``resume``, ``config_sections``). The run config holds ``algorithm``, every
    option of ``args`` (literal API keys and secret headers redacted), the config sections and, under centralized
    collaboration, ``num_roles`` and ``num_actor_models``."""
    from pathlib import Path

    from lightning.pytorch.loggers import WandbLogger

    from comlrl_lightning.config import redact_secrets

    cfg = dict(wandb_config)
    sections = dict(cfg.get("config_sections") or {})
    options = redact_secrets(dict(args.to_dict()) if hasattr(args, "to_dict") else {})
    run_config = {"algorithm": algorithm, **options, **sections}
    if options.get("collaboration_mode") == "centralized":  # R roles written by one actor model
        run_config.update(num_roles=args.num_agents, num_actor_models=1)
    dataset = sections.get("dataset") or {}
    if isinstance(dataset, dict):
        run_config.update({f"dataset_{k}": dataset[k] for k in ("name", "type") if k in dataset})
    if cfg.get("dir"):
        Path(cfg["dir"]).mkdir(parents=True, exist_ok=True)
    kwargs = {k: cfg[k] for k in ("project", "entity", "tags", "id", "resume") if cfg.get(k) is not None}
    name = cfg.get("name", cfg.get("run_name"))
    return WandbLogger(name=name, save_dir=cfg.get("dir") or ".", config=run_config, **kwargs)


def check_args_kept(config: Any) -> None:
    """Warn when a parse dropped options of ``model.init_args.args`` given in a ``--config`` file.

    ``args`` of MADPOModule is ``MADPOConfig | MADPOIterConfig`` (MARLHF's likewise): jsonargparse picks the type by
    the fields given. A command-line override of a key inside one of its fields
    (``--model.init_args.args.vllm_kwargs.x=1``) is re-read on its own, where the first type of the union fits, and
    the fields only the other type has (``num_iterations``, ``comparator_policy``, ...) are reset to their defaults.
    The CLI gives one-field overrides (``--model.init_args.args.max_new_tokens=4``) as a mapping, which keeps them
    (:func:`comlrl_lightning.cli.args_overrides_merged`); this check is the safety net for what is left. The warning
    names the lost fields and the fix (a second config file, which jsonargparse merges field by field)."""
    import warnings

    import yaml

    parsed = (config.get("model") or {}).get("init_args", {}).get("args") if hasattr(config, "get") else None
    if parsed is None:
        return
    kept = set(vars(parsed)) if hasattr(parsed, "__dict__") else set(getattr(parsed, "keys", lambda: [])())
    init = getattr(parsed, "init_args", None)
    if init is not None and hasattr(init, "__dict__"):  # the class_path / init_args form
        kept |= set(vars(init))
    lost: dict[str, str] = {}
    for path in config.get("config") or []:
        read = getattr(path, "get_content", None)
        try:
            doc = yaml.safe_load(read() if read else Path(str(path)).read_text())
        except (OSError, yaml.YAMLError):
            continue
        args = ((((doc or {}).get("model") or {}).get("init_args") or {}).get("args") or {}) \
            if isinstance(doc, dict) else {}
        if isinstance(args, dict) and "class_path" in args:  # the type named: its fields are under init_args
            args = args.get("init_args") or {}
        if not isinstance(args, dict):
            continue
        for key in args:
            if key not in kept:
                lost[key] = str(path)
    if lost:
        names = ", ".join(sorted(lost))
        warnings.warn(
            f"model.init_args.args lost {names} (set in {sorted(set(lost.values()))[0]}): a command-line override "
            "made the parser re-read the config as another type, which resets them to their defaults. "
            "Give the change in a second config file instead, e.g. --config override.yaml holding model: "
            "{init_args: {args: {max_new_tokens: 4}}}: files are merged field by field.", UserWarning, stacklevel=2)
