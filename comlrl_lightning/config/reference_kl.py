"""Reference-KL options: a penalty beta * KL(policy || frozen initial policy) on each completion's reward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from comlrl_lightning.config.checks import bad_option, is_number
from comlrl_lightning.config.devices import device_count


@dataclass
class ReferenceKLOptions:
    """The frozen-reference KL penalty."""

    reference_kl_enabled: bool = False
    """Subtract reference_kl_coef * KL(policy || frozen initial policy) from each completion's reward."""
    reference_kl_coef: float = 0.1
    """beta >= 0 (checked even when the KL is off)."""
    reference_devices: Any = None
    """Device spec of the reference models (default: each agent's device); a string or 1 or N entries."""


def check_reference_kl_coef(cfg: Any) -> None:
    """``reference_kl_coef`` must be a finite number >= 0, whether or not the KL is on."""
    if not is_number(cfg.reference_kl_coef) or not cfg.reference_kl_coef >= 0:
        raise bad_option("reference_kl_coef must be >= 0.", cfg.reference_kl_coef, "finite numbers >= 0")


def check_reference_devices(cfg: Any) -> None:
    """With reference KL on, ``reference_devices`` (when a list) must name 1 or ``num_agents`` devices; on or off,
    the devices it names must exist here."""
    count = device_count(cfg.reference_devices)
    if cfg.reference_kl_enabled and count is not None and count not in (1, cfg.num_agents):
        raise bad_option(f"reference_devices length ({count}) must be 1 or N.", cfg.reference_devices,
                         f"a device string, or a list of 1 or num_agents={cfg.num_agents} entries")
    from comlrl_lightning.config.devices import check_devices_exist

    check_devices_exist(cfg, "reference_devices")
