"""Where the agents, critics and references live under ``parallel_training="mp"``.

A device spec is None (follow the Lightning accelerator), one device string (every member on it), or a list of
1 or N strings (member i on entry i). :func:`resolve_devices` turns a spec into one ``torch.device`` per member;
:func:`missing_device` finds a device this machine does not have (``cuda:3`` on a 2-GPU machine, any ``cuda``
without CUDA, ``mps`` without Metal); the configs refuse it at construction, naming the option. The placement itself is
:meth:`~comlrl_lightning.modules.base.TeamModuleBase.place_members` (docs/architecture.md, "Devices").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def resolve_devices(spec: Any, count: int, option: str) -> list[torch.device] | None:
    """One ``torch.device`` per member from ``spec`` (None or "auto": None, i.e. follow the accelerator; a
    string: that device ``count`` times; a list of 1 entry: repeated; a list of ``count`` entries: in order)."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "auto"):
        return None
    items = [spec] if isinstance(spec, (str, torch.device)) else list(spec)
    if len(items) not in (1, count):
        raise ValueError(f"{option} length ({len(items)}) must be 1 or {count}. Got {spec!r}.")
    try:
        devices = [torch.device(d) for d in items]
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"{option} holds something that is not a device: {spec!r} ({exc}). Allowed: strings "
                         "such as 'cpu', 'cuda:0', 'mps'.") from None
    return devices * count if len(devices) == 1 else devices


def available_devices() -> list[str]:
    """The devices of this machine, as strings: ``cpu``, ``cuda:0`` ... ``cuda:K-1``, ``mps`` when present."""
    names = ["cpu"]
    if torch.cuda.is_available():
        names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        names.append("mps")
    return names


def missing_device(spec: Any) -> str | None:
    """The first entry of ``spec`` naming a device this machine does not have (:func:`available_devices`), else
    None. None and "auto" name no device."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "auto"):
        return None
    have = available_devices()
    for entry in [spec] if isinstance(spec, (str, torch.device)) else list(spec):
        try:
            device = torch.device(entry)
        except (RuntimeError, TypeError):
            return str(entry)
        name = device.type if device.type in ("cpu", "mps") else f"{device.type}:{device.index or 0}"
        if name not in have:
            return str(entry)
    return None


def common_device(devices: Sequence[torch.device]) -> torch.device | None:
    """The one device all of ``devices`` share, else None."""
    unique = {str(d) for d in devices}
    return devices[0] if len(unique) == 1 else None


def device_of(module: torch.nn.Module, default: torch.device | str = "cpu") -> torch.device:
    """The device of ``module``'s first parameter, or ``default`` when it has none."""
    for p in module.parameters():
        return p.device
    return torch.device(default)
