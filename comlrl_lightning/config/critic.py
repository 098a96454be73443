"""Critic options of the actor-critic trainers (IAC, MAAC) and of MARLHF's maac/iac RL stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from comlrl_lightning.config.checks import bad_option, check_optional_count, check_positive


@dataclass
class CriticOptions:
    """The critic: learning rate, devices, what it estimates and how much its loss weighs."""

    critic_learning_rate: float | None = 5e-6
    """Critic AdamW learning rate; None = ``agent_learning_rate`` (IAC, MARLHF; MAAC needs a number)."""
    critic_devices: Any = None
    """Device spec of the critics (required by "mp" when there are separate critics)."""
    critic_type: str = "v"
    """"v": V(h), the value at the last prompt token; "q": Q(h, a), at the last response token. Case-insensitive."""
    value_loss_coef: float = 0.6
    """Weight of the critic's squared error (> 0)."""


@dataclass
class ValueHeadOptions:
    """IAC only: separate critic models or value heads on the actors, and the heads' shape."""

    use_separate_critic: bool = True
    """True: one separate critic model per agent. False: a value head attached to each actor."""
    value_clip_range: float | None = 0.2
    """PPO-style value clipping epsilon; applied only to attached value heads (upstream). None disables it."""
    critic_value_head_hidden_dim: int | None = None
    """Hidden projection (Linear + Tanh) of the separate critics' value head; None = a single Linear."""
    value_head_hidden_dim: int | None = None
    """Hidden projection of the attached value heads; None = a single Linear."""


def normalize_critic_type(cfg: Any) -> None:
    """``critic_type``: stripped and lowercased; "v" or "q"."""
    ct = "" if cfg.critic_type is None else str(cfg.critic_type).strip().lower()
    if ct not in ("v", "q"):
        raise bad_option("critic_type must be one of: v, q.", cfg.critic_type, "v, q (case-insensitive)")
    cfg.critic_type = ct


def check_critic_learning_rate(cfg: Any, *, falls_back: bool = True) -> None:
    """``critic_learning_rate`` > 0; None is allowed when it falls back to ``agent_learning_rate``."""
    if falls_back:
        check_positive("critic_learning_rate", cfg.critic_learning_rate, nullable=True)
    else:
        check_positive("critic_learning_rate", cfg.critic_learning_rate, message=(
            f"critic_learning_rate must be > 0 ({cfg._method} does not fall back to agent_learning_rate)."))


def check_value_loss_coef(cfg: Any) -> None:
    """``value_loss_coef`` must be > 0: with 0 the critic would never learn and the advantages stay noise."""
    check_positive("value_loss_coef", cfg.value_loss_coef)


def check_value_head_options(cfg: Any) -> None:
    """``value_clip_range`` > 0 or None; the head hidden dims >= 1 or None."""
    check_positive("value_clip_range", cfg.value_clip_range, nullable=True)
    for name in ("critic_value_head_hidden_dim", "value_head_hidden_dim"):
        check_optional_count(name, getattr(cfg, name))
