"""Where the agents, critics and references live under ``parallel_training="mp"``.

A device spec is None (follow the Lightning accelerator), one device string (every member on it), or a list of
1 or N strings (member i on entry i). :func:`resolve_devices` turns a spec into one ``torch.device`` per member;
:func:`missing_device` finds a device this machine does not have (``cuda:3`` on a 2-GPU machine, any ``cuda``
without CUDA, ``mps`` without Metal); the configs refuse it at construction, naming the option. The placement itself is
:meth:`~comlrl_lightning.modules.base.TeamModuleBase.place_members` (docs/architecture.md, "Devices").
:func:`overlap_groups` decides which agents' generation calls run at the same time, :func:`update_groups` which agents'
updates do (option ``agent_overlap``).
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


AGENT_OVERLAP_MODES = ("auto", "on", "off")


def normalize_agent_overlap(value: Any) -> str:
    """``agent_overlap`` as one of :data:`AGENT_OVERLAP_MODES`: None means "auto", True "on", False "off" (YAML reads
    a bare ``on``/``off`` as a boolean); strings are stripped and lowercased. Anything else is a ``ValueError``."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    key = value.strip().lower() if isinstance(value, str) else None
    if key not in AGENT_OVERLAP_MODES:
        raise ValueError(f"agent_overlap must be one of: auto, on, off. Got {value!r}. Allowed: auto (overlap when "
                         "the agents sit on >= 2 distinct devices), on (always, one worker per distinct model), off "
                         "(agent after agent); true/false mean on/off.")
    return key


def _check_mode(mode: str) -> None:
    if mode not in AGENT_OVERLAP_MODES:
        raise ValueError(f"overlap mode must be one of {AGENT_OVERLAP_MODES}. Got {mode!r}.")


def connected_groups(keys: Sequence[set[Any]]) -> list[list[int]]:
    """Indices 0..len(keys)-1 grouped so that two indices whose key sets share a key (directly or through others)
    land in one group; groups in order of their first index, each in index order."""
    parent = list(range(len(keys)))

    def root(j: int) -> int:
        while parent[j] != j:
            parent[j] = parent[parent[j]]
            j = parent[j]
        return j

    owner: dict[Any, int] = {}
    for j, job_keys in enumerate(keys):
        for key in job_keys:
            if key in owner:
                parent[root(j)] = root(owner[key])
            else:
                owner[key] = j
    groups: dict[int, list[int]] = {}
    for j in range(len(keys)):
        groups.setdefault(root(j), []).append(j)
    return sorted(groups.values(), key=lambda g: g[0])


def overlap_groups(devices: Sequence[torch.device], models: Sequence[Any], mode: str) -> list[list[int]]:
    """Indices of the agents' calls grouped into workers that run at the same time; within a group, one after
    another in index order. ``devices[i]``/``models[i]``: the device and model object of call i.

    "off": one group. "auto": one group per distinct device, if there are >= 2 of them (else one group). "on": one
    group per distinct model object (calls on one model, e.g. LoRA adapters of one base, never run at once).
    """
    _check_mode(mode)
    if mode == "off":
        return connected_groups([{"all"}] * len(devices))
    return connected_groups([{str(d)} for d in devices] if mode == "auto" else [{id(m)} for m in models])


def update_groups(members: Sequence[Sequence[torch.nn.Module]], mode: str) -> list[list[int]]:
    """Indices of update jobs grouped into workers that run at the same time; within a group, one after another in
    index order. ``members[j]``: the modules job j trains or reads (an agent's model, its value head, its critic).

    Two jobs share a group when they touch a common parameter tensor (one model object, LoRA adapters of one base,
    MAAC's one critic), under "on" and "auto"; under "auto" also when they touch a common device. "off": one group.
    """
    _check_mode(mode)
    if mode == "off":
        return connected_groups([{"all"}] * len(members))
    params = [[p for m in modules for p in m.parameters()] for modules in members]
    return connected_groups([{id(p) for p in ps} | ({str(p.device) for p in ps} if mode == "auto" else set())
                             for ps in params])


def draws_random_numbers(module: torch.nn.Module) -> bool:
    """True when a training-mode forward of ``module`` may draw from the device's global RNG: an ``nn.Dropout``-like
    module with ``p > 0``, or a ``config.attention_dropout`` above 0 (HF attention applies it functionally). Two
    threads drawing from one generator would get numbers in the order of their timing."""
    for m in module.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            return True
        config = getattr(m, "config", None)
        if config is not None and float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0:
            return True
    return False
