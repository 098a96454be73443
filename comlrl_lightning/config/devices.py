"""Device options of the agents: ``parallel_training``, ``agent_devices`` (devices default to the Lightning
accelerator in use) and ``agent_overlap``."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from comlrl_lightning.config.checks import SuggestOptions, bad_option


@dataclass
class DeviceOptions(SuggestOptions):
    """Where the agents live. (Every config has this group, so every config suggests the closest option names.)"""

    parallel_training: str = "none"
    """"none" or "mp" ("null" = "none"; case-insensitive). "mp": agent i lives on ``agent_devices[i]`` (critics on
    ``critic_devices``), in one process; "none": every agent on the Lightning accelerator's device."""
    agent_devices: Any = None
    """Device spec of the agents: None (the Lightning accelerator), a string, or a list of length 1 or N;
    required with parallel_training="mp"."""
    agent_overlap: Any = "auto"
    """Whether the agents' generation calls of one level (HF engine) and their updates (a MAGRPO-family or IAC
    drain; MADPO's forwards and shares of the joint backward) run at the same time, in threads
    (docs/architecture.md, "Devices"): "auto" (when the agents sit on >= 2 distinct devices, e.g. "mp" with
    distinct ``agent_devices``: one thread per device), "on" (always: one thread per distinct model, even on one
    device), "off" (agent after agent). Results are identical either way for a fixed seed. Updates stay
    sequential under several processes, 16-mixed or dropout. true/false = on/off."""


def device_count(spec: Any) -> int | None:
    """Entries of a device spec: None for None/"auto"/a single string (any count), else the list length."""
    if spec is None or isinstance(spec, str):
        return None
    return len(list(spec))


def normalize_parallel_training(cfg: Any) -> None:
    """``parallel_training``: lowercased, "null" → "none", only none/mp; "mp" needs ``agent_devices``.
    ``agent_overlap``: auto/on/off (:func:`~comlrl_lightning.devices.normalize_agent_overlap`)."""
    from comlrl_lightning.devices import normalize_agent_overlap

    pt = "none" if cfg.parallel_training is None else str(cfg.parallel_training).strip().lower()
    pt = "none" if pt == "null" else pt
    if pt not in ("none", "mp"):
        raise bad_option("parallel_training only supports: none, mp.", cfg.parallel_training, "none, mp")
    if pt == "mp" and cfg.agent_devices is None:
        raise bad_option("parallel_training='mp' requires explicit agent_devices.", cfg.agent_devices,
                         "a device string or a list of length 1 or num_agents")
    cfg.parallel_training = pt
    cfg.agent_overlap = normalize_agent_overlap(cfg.agent_overlap)
    check_devices_exist(cfg, "agent_devices")


#: Every device option of the configs; each is checked against the machine at construction, whatever the mode.
DEVICE_OPTIONS = ("agent_devices", "critic_devices", "reference_devices", "comparator_devices", "reward_model_device")


def check_devices_exist(cfg: Any, name: str) -> None:
    """Every device named by option ``name`` exists on this machine (checked at construction, so a typo such
    as ``cuda:3`` on a 2-GPU machine, or ``cuda:1`` on a CPU-only one, fails before any model is loaded)."""
    from comlrl_lightning.devices import available_devices, missing_device

    spec = getattr(cfg, name)
    bad = missing_device(spec)
    if bad is not None:
        raise bad_option(f"{name} names {bad!r}, a device this machine does not have.", spec,
                         "devices of this machine: " + ", ".join(available_devices()))


def check_device_list(cfg: Any, name: str, expected: int) -> None:
    """A device list in option ``name`` must be non-empty and, in "mp" mode, have 1 or ``expected`` entries (with
    "none" the first entry is used, as upstream's resolve_single_device does). Its devices must exist here."""
    check_devices_exist(cfg, name)
    if cfg.parallel_training != "mp":
        warn_unused_devices(cfg, name, f"with parallel_training={cfg.parallel_training!r} every model lives on the "
                            f"Lightning accelerator's device. Set parallel_training='mp' to place model i on {name}[i] "
                            "(or choose the device with the Trainer's accelerator/devices)")
    count = device_count(getattr(cfg, name))
    if count is None or (cfg.parallel_training != "mp" and count):
        return
    if count == 0:
        raise bad_option(f"{name} must be a non-empty list or 'auto'.", getattr(cfg, name), "non-empty lists")
    if count not in (1, expected):
        raise bad_option(f"{name} length ({count}) must be 1 or {expected}.", getattr(cfg, name),
                         f"a device string or a list of length 1 or {expected}")


def warn_unused_devices(cfg: Any, name: str, why: str) -> None:
    """Warn (once per place) that device option ``name`` is set but takes no effect, saying why and what to set."""
    spec = getattr(cfg, name)
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "auto"):
        return
    warnings.warn(f"{name}={spec!r} has no effect: {why}.", UserWarning, stacklevel=4)
