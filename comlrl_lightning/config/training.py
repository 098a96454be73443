"""Training-loop options every trainer has: epochs, learning rate, logging, agents, buffers, evaluation, seed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from comlrl_lightning.config.checks import bad_option, check_positive, is_int

#: Integer options and their minimum, in the order their errors are raised (docs/preference.md §2.6).
COUNT_RULES = (
    ("num_train_epochs", 1), ("num_agents", 1), ("rollout_buffer_size", 1), ("eval_interval", 0),
    ("eval_num_samples", 0), ("eval_batch_size", 1), ("num_turns", 1), ("logging_steps", 1),
)


@dataclass
class TrainingOptions:
    """Epochs, learning rate, logging and agent count."""

    num_train_epochs: int = 20
    """Passes over the training data (MADPO: over the pair set; iterative trainers: per round)."""
    agent_learning_rate: float = 5e-6
    """AdamW learning rate, one optimizer per agent."""
    logging_steps: int = 50
    """Minimum env-step distance between two training-metric logs (1 = log every entry)."""
    num_agents: int = 2
    """Number of agents (roles)."""


@dataclass
class BatchOptions:
    """Evaluation cadence, rollout buffer and minibatches."""

    eval_interval: int = 16
    """Evaluate before every k-th training item or update (0 = never; a final evaluation runs when eval data
    exists)."""
    eval_num_samples: int = 4
    """Evaluation items per evaluation (the first ones of ``eval_dataset``)."""
    eval_batch_size: int = 1
    """Evaluation items generated together."""
    rollout_buffer_size: int = 2
    """Samples per agent that trigger an update; also the default of ``train_batch_size``."""
    train_batch_size: int | None = None
    """Samples (MADPO: pairs) per optimizer step inside an update (None = ``rollout_buffer_size``)."""
    advantage_normalization: bool = True
    """Z-normalise advantages (RL trainers and the RL stage of MARLHF)."""


@dataclass
class SeedOptions:
    """Our addition: one seed for every random stream of a run."""

    seed: int = 0
    """Seed of the sampling streams (agents, comparator, eval) and of pair / minibatch shuffling."""


def check_training_counts(cfg: Any) -> None:
    """Every integer option of :data:`COUNT_RULES` that ``cfg`` has: ``{name} must be >= {minimum}.``; ``seed``
    must be an integer (a string or float seed would fail deep inside ``random``/``torch``)."""
    for name, minimum in COUNT_RULES:
        if not hasattr(cfg, name):
            continue
        value = getattr(cfg, name)
        if not is_int(value) or value < minimum:
            raise bad_option(f"{name} must be >= {minimum}.", value, f"integers >= {minimum}")
    if hasattr(cfg, "seed") and not is_int(cfg.seed):
        raise bad_option("seed must be an integer.", cfg.seed, "integers")


def check_train_batch_size(cfg: Any) -> None:
    """``train_batch_size``: None becomes ``rollout_buffer_size``; otherwise an integer >= 1."""
    if cfg.train_batch_size is None:
        cfg.train_batch_size = cfg.rollout_buffer_size
    if not is_int(cfg.train_batch_size) or cfg.train_batch_size < 1:
        raise bad_option("train_batch_size must be >= 1.", cfg.train_batch_size, "integers >= 1 or null")


def check_agent_learning_rate(cfg: Any) -> None:
    """``agent_learning_rate`` must be a finite number > 0."""
    check_positive("agent_learning_rate", cfg.agent_learning_rate)
