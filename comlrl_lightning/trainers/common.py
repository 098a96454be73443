"""Checks shared by the facades (CoMLRL's constructor errors, spec preference.md §2.7)."""

from __future__ import annotations

from typing import Any


def check_facade_inputs(agent_model: Any, agents: Any, reward_func: Any, train_dataset: Any) -> None:
    """Agents given one way or the other, a callable task reward, and task items."""
    if agent_model is None and agents is None:
        raise ValueError("Either agent_model or agents must be provided.")
    if not callable(reward_func):
        raise ValueError(f"reward_func must be a callable; got {type(reward_func).__name__}.")  # noqa: TRY004
    if train_dataset is None:
        raise ValueError("train_dataset is required (a datasets.Dataset, a list of dicts or a local file).")


def sync_num_agents(args: Any, agents: Any, num_agents: int | None) -> None:
    """``args.num_agents`` follows ``len(agents)``; an explicit ``num_agents`` must agree with ``args``."""
    if agents is not None and num_agents is None:
        args.num_agents = len(agents)
    elif num_agents is not None and num_agents != args.num_agents:
        raise ValueError(f"num_agents ({num_agents}) must match args.num_agents ({args.num_agents}).")
