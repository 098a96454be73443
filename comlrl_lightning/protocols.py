"""The contracts between the Lightning pieces: what a callback may ask of a module and of a data module.

Callbacks never reach into a module or a data module beyond these protocols, and never write their
attributes: they call the methods listed here. Each round callback checks its counterparts once, in
``setup``, with :func:`check_protocol`, so a mismatch is an error naming the missing member, not an
``AttributeError`` rounds later. ``docs/architecture.md`` draws who calls what at which hook.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Oracle(Protocol):
    """Scores one joint response (one completion per agent) of a task item: ``(processed, raw)`` reward."""

    def score(self, prompts: Sequence[str], completions: Sequence[str], item: dict,
              item_index: Any) -> tuple[float, float]: ...


@runtime_checkable
class TaskSource(Protocol):
    """The task: items, per-agent prompt formatters, the task-reward oracle, the multi-turn transition."""

    train_items: list[dict]
    eval_items: list[dict]
    formatters: Sequence[Callable[[dict], str]]
    oracle: Oracle
    prompt_field: str


@runtime_checkable
class RolloutTask(TaskSource, Protocol):
    """A task the RL modules roll out: a :class:`TaskSource` with its multi-turn transition (None: single turn)."""

    external_transition: Callable | None


@runtime_checkable
class Comparator(Protocol):
    """The policy the current agents are compared against in a round.

    Required: ``sample(prompts_per_agent, num_candidates, items) -> list[Samples]`` (one
    :class:`~comlrl_lightning.generation.Samples` per agent, ``num_candidates`` texts per prompt). Optional
    life-cycle methods, called when present: ``setup(trainer, pl_module)`` once per fit (read the module's
    team, the run's folders), ``prepare(round_index)`` before round t's collection (load a snapshot, copy
    the current policy...), ``release()`` once the round's pairs exist, and ``state_dict()`` /
    ``load_state_dict(state)`` with plain types (they travel in the round data's checkpoint state).
    """

    def sample(self, prompts: Sequence[Sequence[str]], num_candidates: int, items: Sequence[dict]) -> list: ...


@runtime_checkable
class PairSink(TaskSource, Protocol):
    """A task source that trains on preference pairs: collection callbacks hand pairs to ``add_round``; ``pairs`` are
    what the round trains on."""

    pairs: list

    def add_round(self, pairs: Sequence[Any]) -> None: ...


@runtime_checkable
class RoundData(PairSink, Protocol):
    """A data module that trains on rounds of preference pairs (rounds are epochs).

    It owns the run's comparator (configured once, under ``data:`` in YAML) and the pairs: the collection
    callback hands a round's new pairs to :meth:`add_round`, the replay callback turns them into the
    round's training pairs with :meth:`commit_round`.
    """

    pending_round: int | None
    candidate_raw_rewards: dict | None  # the last round's raw candidate rewards (record_candidate_rewards)

    def comparator_for(self, trainer: Any, pl_module: Any) -> Comparator: ...
    def offer_comparator(self, comparator: Any, who: str) -> None: ...
    def collection_oracle(self) -> Oracle: ...
    def use_preference_oracle(self, oracle: Oracle | None) -> None: ...
    def commit_round(self, mode: str, sample_size: int | None = None, k: int | None = None,
                     lam: float | None = None) -> dict[str, int]: ...
    def record_candidate_rewards(self, round_index: int, target: Sequence[float],
                                 comparator: Sequence[float]) -> None: ...


@runtime_checkable
class TeamModule(Protocol):
    """A LightningModule that trains a team of agents.

    ``team`` (an :class:`~comlrl_lightning.agents.AgentTeam`), ``args`` (its config), ``updates_seen`` (task
    items or pairs trained so far; ``updates_in_batch(batch)`` says by how much a training batch advances it), the
    sampling settings of training, ``save_agents(output_dir)`` (one
    ``agent_{i}/`` folder per agent), :meth:`evaluate` (task-reward
    evaluation on given items; multi-turn modules roll out every turn), :meth:`use_evaluation_settings` (the seed
    and samples per item of the evaluation that runs during fit and validate) and :meth:`use_train_oracle` (the
    reward that scores training rollouts; None = the data module's task reward).
    """

    team: Any
    args: Any
    updates_seen: int

    def sampling_settings(self) -> Any: ...
    def updates_in_batch(self, batch: Any) -> int: ...
    def save_agents(self, output_dir: str) -> list[str]: ...
    def evaluate(self, items: Sequence[dict], task: TaskSource, seed: int, samples_per_item: int = 1) -> dict: ...
    def use_evaluation_settings(self, seed: int = 12345, samples_per_item: int = 1) -> None: ...
    def use_train_oracle(self, oracle: Oracle | None) -> None: ...


def check_protocol(obj: Any, protocol: type, who: str, what: str, example: str) -> None:
    """Raise a ``TypeError`` naming the first member of ``protocol`` that ``obj`` lacks."""
    names = [n for n in getattr(protocol, "__protocol_attrs__", ()) if not n.startswith("_")]
    if not names:  # Python < 3.12 keeps no __protocol_attrs__
        names = [n for k in protocol.__mro__ if k not in (object, Protocol, Any)
                 for n in list(getattr(k, "__annotations__", {})) + list(vars(k)) if not n.startswith("_")]
    for name in dict.fromkeys(names):
        if not hasattr(obj, name):
            raise TypeError(f"{who} needs a {what} with `{name}` (the {protocol.__name__} protocol of "
                            f"comlrl_lightning.protocols; e.g. {example}); got {type(obj).__name__}.")
