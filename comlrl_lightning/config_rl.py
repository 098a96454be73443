"""Configs of the MAGRPO family (MAGRPO, MAREINFORCE, MARLOO, MAReMax): spec multiturn.md §1.1.

Option names, defaults and allowed values are upstream's, with our decisions applied (spec README):
``joint_mode`` is validated and normalised here (1, 10: "align" → "aligned", "crossed" → "cross"),
``early_termination_threshold`` defaults to None (10), ``num_turns`` defaults to 1 (10) so a single-turn
run needs no transition, and ``advantage_mode`` is validated here rather than in the trainer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from comlrl_lightning.config import (
    JOINT_MODE_ALIASES,
    _bad,
    _normalize_choice,
    check_counts,
    check_reference_devices,
    check_sampling,
    normalize_parallel_training,
)
from comlrl_lightning.losses import ADVANTAGE_MODES


@dataclass
class MAGRPOConfig:
    """Options of the MAGRPO trainer (and, through the subclasses, MAREINFORCE / MARLOO / MAReMax)."""

    num_train_epochs: int = 20
    """Passes over the train dataset."""
    agent_learning_rate: float = 5e-6
    """AdamW learning rate, one optimizer per agent."""
    logging_steps: int = 50
    """Minimum env-step distance between two logged training entries (1 = log every entry)."""
    num_agents: int = 2
    """Number of agents (checked against the agents actually given)."""
    parallel_training: str = "none"
    """"none" or "mp" ("null" = "none"); accepted for compatibility, agents still run one after another."""
    agent_devices: Any = None
    """Device spec of the agents; required with parallel_training="mp"."""
    num_generations: int = 4
    """K: samples per agent per tree node (>= 2: the group baseline needs several)."""
    max_new_tokens: int = 256
    """Generation length in tokens."""
    temperature: float = 0.6
    """Sampling temperature."""
    top_p: float = 0.6
    """Nucleus sampling threshold."""
    top_k: int | None = 50
    """Top-k sampling; None leaves it off."""
    num_turns: int = 1
    """T: depth of the rollout tree. Above 1 an external transition is required."""
    discount: float = 1.0
    """Unused by MAGRPO (returns are undiscounted, as upstream 1.4.3); kept for compatibility."""
    joint_mode: str = "aligned"
    """"aligned" ("align"): K joint actions per node; "cross" ("crossed"): all K^N combinations."""
    early_termination_threshold: float | None = None
    """A branch stops expanding when its node's mean immediate reward is > this. None = off."""
    external_prompt_passthrough: bool = False
    """Use the transition's strings as prompts as they are (no formatter)."""
    eval_interval: int = 16
    """Evaluate before every k-th training item (0 = only at the end)."""
    eval_num_samples: int = 4
    """Eval items per evaluation."""
    eval_batch_size: int = 1
    """Eval items generated together."""
    rollout_buffer_size: int = 2
    """Node samples per agent that trigger an update."""
    train_batch_size: int | None = None
    """Node samples per optimizer step inside an update (None = rollout_buffer_size)."""
    advantage_normalization: bool = True
    """Z-normalise advantages within each node's sibling group."""
    advantage_mode: str = "mean"
    """Baseline: mean (MAGRPO), raw (MAREINFORCE), rloo (MARLOO) or max (MAReMax)."""
    reference_kl_enabled: bool = False
    """Subtract reference_kl_coef * KL(policy || frozen initial policy) from each completion's return."""
    reference_kl_coef: float = 0.1
    """beta >= 0 (checked even when the KL is off)."""
    reference_devices: Any = None
    """Device spec of the reference models (default: each agent's device); 1 or N entries."""
    seed: int = 0
    """Seed of the sampling streams and of the minibatch shuffles (ours)."""

    _method = "MAGRPO"

    def __post_init__(self) -> None:
        check_counts(self, ("num_train_epochs", "num_agents", "rollout_buffer_size", "eval_batch_size", "num_turns",
                            "logging_steps"), ("eval_interval", "eval_num_samples"))
        if self.train_batch_size is None:
            self.train_batch_size = self.rollout_buffer_size
        if not isinstance(self.train_batch_size, int) or self.train_batch_size < 1:
            raise _bad("train_batch_size must be >= 1.", self.train_batch_size, "integers >= 1 or null")
        if not isinstance(self.num_generations, int) or self.num_generations < 2:
            raise _bad("num_generations must be >= 2 (group baseline requires multiple samples).",
                       self.num_generations, "integers >= 2")
        normalize_parallel_training(self)
        self.joint_mode = _normalize_choice("joint_mode", self.joint_mode, JOINT_MODE_ALIASES, "aligned",
                                            "joint_mode must be one of: aligned, cross.")
        mode = "mean" if self.advantage_mode is None else str(self.advantage_mode).strip().lower()
        if mode not in ADVANTAGE_MODES:
            raise _bad("advantage_mode must be one of: mean, raw, max, rloo.", self.advantage_mode,
                       ", ".join(ADVANTAGE_MODES))
        self.advantage_mode = mode
        if not isinstance(self.reference_kl_coef, (int, float)) or not self.reference_kl_coef >= 0:
            raise _bad("reference_kl_coef must be >= 0.", self.reference_kl_coef, "numbers >= 0")
        check_reference_devices(self)
        if self.early_termination_threshold is not None:
            try:
                self.early_termination_threshold = float(self.early_termination_threshold)
            except (TypeError, ValueError):
                raise _bad("early_termination_threshold must be a number or null.",
                           self.early_termination_threshold, "numbers or null") from None
        check_sampling(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain-type dict of every option (for logging and checkpoints)."""
        return asdict(self)


@dataclass
class MAREINFORCEConfig(MAGRPOConfig):
    """MAGRPO with the raw-return baseline (A = G')."""

    advantage_mode: str = "raw"
    """Baseline: raw by default (see :class:`MAGRPOConfig`)."""
    _method = "MAREINFORCE"


@dataclass
class MARLOOConfig(MAGRPOConfig):
    """MAGRPO with the leave-one-out baseline."""

    advantage_mode: str = "rloo"
    """Baseline: rloo by default (see :class:`MAGRPOConfig`)."""
    _method = "MARLOO"


@dataclass
class MAReMaxConfig(MAGRPOConfig):
    """MAGRPO with the group-max baseline."""

    advantage_mode: str = "max"
    """Baseline: max by default (see :class:`MAGRPOConfig`)."""
    _method = "MAReMax"
