"""Episode options: turns, discount, early termination, prompt passthrough, and the advantage baseline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from comlrl_lightning.config.checks import bad_option, is_int, is_number
from comlrl_lightning.losses import ADVANTAGE_MODES


@dataclass
class RolloutOptions:
    """How an episode unfolds over turns."""

    num_turns: int = 1
    """Turns per episode (tree depth for MAGRPO); above 1 an external transition is required. Preference
    trainers support 1 only."""
    discount: float = 1.0
    """Discount in [0, 1]: the actor-critic TD target's gamma; unused by MAGRPO (undiscounted returns, as
    upstream 1.4.3) and forwarded to the RL stage by MARLHF."""
    early_termination_threshold: float | None = None
    """A branch or episode stops after a turn whose mean immediate reward is > this. None = off."""
    external_prompt_passthrough: bool = False
    """Multi-turn: use the transition's strings as prompts as they are, with no formatter."""


@dataclass
class GenerationBatchOptions:
    """How many task items one training step rolls out together (the RL trainers; docs/multiturn.md §2.11)."""

    generation_batch_size: int | None = None
    """Task items (prompts) rolled out together, with one ``generate`` per agent per tree level covering all of them
    (TRL's name; there it counts completions, here prompts). None = the update window: the items up to and
    including the one whose samples trigger the next update, so every item is sampled by exactly the weights that
    would sample it with one item per step (exact on-policy, CoMLRL's semantics). A number rolls out that many
    items per step whatever the updates in between: items after an update are sampled by older weights, and
    ``train/agent{i}/staleness`` logs by how many optimizer steps."""


@dataclass
class EngineCheckOptions:
    """The weight-sync verification of the RL trainers (docs/engines.md, "Verification")."""

    logprob_gap_threshold: float | str | None = "auto"
    """Stop the run when, on an update's first minibatch, the mean absolute gap between the engine's log-probs of
    the sampled tokens and the trainer's exceeds this (nats per token): the engine sampled with weights other than
    the trainer's. "auto": 0.005 when the agent and its engine compute in float32 (a healthy engine measured below
    1e-4 here, one missed update 0.009 to 0.18), 0.1 in lower precision. None turns the check off (the gap is still
    logged as ``engine/agent_{i}/logprob_gap``)."""


@dataclass
class AdvantageModeOptions:
    """Baseline of the MAGRPO family."""

    advantage_mode: str = "mean"
    """Baseline: mean (MAGRPO), raw (MAREINFORCE), rloo (MARLOO) or max (MAReMax). Case-insensitive."""


def check_discount(cfg: Any) -> None:
    """``discount`` must be a number in [0, 1]."""
    if not is_number(cfg.discount) or not 0 <= cfg.discount <= 1:
        raise bad_option("discount must be in [0, 1].", cfg.discount, "numbers in [0, 1]")


def check_early_termination_threshold(cfg: Any) -> None:
    """``early_termination_threshold``: None, or anything ``float()`` accepts (stored as a float)."""
    if cfg.early_termination_threshold is None:
        return
    try:
        cfg.early_termination_threshold = float(cfg.early_termination_threshold)
    except (TypeError, ValueError):
        raise bad_option("early_termination_threshold must be a number or null.", cfg.early_termination_threshold,
                         "numbers or null") from None


def check_advantage_mode(cfg: Any) -> None:
    """``advantage_mode``: stripped and lowercased (None = "mean"); one of mean, raw, max, rloo."""
    mode = "mean" if cfg.advantage_mode is None else str(cfg.advantage_mode).strip().lower()
    if mode not in ADVANTAGE_MODES:
        raise bad_option("advantage_mode must be one of: mean, raw, max, rloo.", cfg.advantage_mode,
                         ", ".join(ADVANTAGE_MODES))
    cfg.advantage_mode = mode


def check_generation_batch_size(cfg: Any) -> None:
    """``generation_batch_size``: None (the update window) or an integer >= 1."""
    value = cfg.generation_batch_size
    if value is not None and (not is_int(value) or value < 1):
        raise bad_option("generation_batch_size must be null (the update window) or an integer >= 1.", value,
                         "null or integers >= 1")


def check_logprob_gap_threshold(cfg: Any) -> None:
    """``logprob_gap_threshold``: "auto", None (off) or a number > 0."""
    value = cfg.logprob_gap_threshold
    if isinstance(value, str) and value.strip().lower() == "auto":
        cfg.logprob_gap_threshold = "auto"
        return
    if value is not None and (not is_number(value) or value <= 0):
        raise bad_option("logprob_gap_threshold must be \"auto\", a number > 0 (nats per token) or null (no check).",
                         value, "\"auto\", numbers > 0 such as 0.05, or null")
