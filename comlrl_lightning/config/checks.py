"""Validation helpers shared by every option group.

A bad value raises ``ValueError`` whose message starts with upstream's sentence (so code written against
CoMLRL keeps matching), then gives the value and what is allowed. The rule of each option lives in the
option group that declares it; these are the building blocks those rules use.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any


def bad_option(message: str, value: Any, allowed: str | None = None) -> ValueError:
    """A ValueError that says what is wrong, the value given, and what is allowed."""
    text = f"{message} Got {value!r}."
    if allowed:
        text += f" Allowed: {allowed}."
    return ValueError(text)


def is_int(value: Any) -> bool:
    """True for ints, False for bools (``True`` is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """True for finite ints and floats, False for bools, NaN and infinities."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def normalize_choice(option: str, value: Any, aliases: dict[str, str], default: str, message: str) -> str:
    """Strip and lowercase ``value``, map it through ``aliases``; None means ``default``."""
    if value is None:
        return default
    key = str(value).strip().lower()
    if key not in aliases:
        allowed = ", ".join(sorted(set(aliases.values()), key=list(aliases.values()).index))
        raise bad_option(message, value, f"{allowed} (aliases: {', '.join(sorted(aliases))})")
    return aliases[key]


def check_counts(cfg: Any, at_least_one: tuple[str, ...], at_least_zero: tuple[str, ...] = ()) -> None:
    """Integer options that must be >= 1 / >= 0 (upstream's messages plus the value and what is allowed)."""
    for name in at_least_one:
        value = getattr(cfg, name)
        if not is_int(value) or value < 1:
            raise bad_option(f"{name} must be >= 1.", value, "integers >= 1")
    for name in at_least_zero:
        value = getattr(cfg, name)
        if not is_int(value) or value < 0:
            raise bad_option(f"{name} must be >= 0.", value, "integers >= 0")


def check_positive(name: str, value: Any, *, nullable: bool = False, message: str | None = None) -> None:
    """``value`` must be a finite number > 0 (or None when ``nullable``)."""
    if nullable and value is None:
        return
    if not is_number(value) or not value > 0:
        suffix = " or null" if nullable else ""
        raise bad_option(message or f"{name} must be > 0{suffix}.", value, f"finite numbers > 0{suffix}")


def check_optional_count(name: str, value: Any) -> None:
    """``value`` must be None or an integer >= 1."""
    if value is not None and (not is_int(value) or value < 1):
        raise bad_option(f"{name} must be >= 1 or null.", value, "integers >= 1 or null")


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """" Did you mean a, b?" naming the options closest to ``name`` (spelling, or containing it, as
    ``learning_rate`` → ``agent_learning_rate``); empty when none is close."""
    import difflib

    options = sorted(set(choices))
    close = difflib.get_close_matches(name, options, n=3, cutoff=0.6)
    hits = (close + [o for o in options if name in o and o not in close])[:3]
    return f" Did you mean {', '.join(hits)}?" if hits else ""


@dataclasses.dataclass
class SuggestOptions:
    """Base of the config option groups: an option name the config does not have is a ``TypeError`` that names
    the config and the closest options (a dataclass alone says only "unexpected keyword argument"). A dataclass
    itself, with no fields, so that the configs stay pure dataclasses (jsonargparse then saves them as plain
    mappings, not as ``class_path``/``init_args``)."""

    def __new__(cls, *args: Any, **kwargs: Any):
        if kwargs and dataclasses.is_dataclass(cls):
            names = {f.name for f in dataclasses.fields(cls) if f.init}
            for key in kwargs:
                if key not in names:
                    raise TypeError(f"{cls.__name__} has no option {key!r}.{did_you_mean(key, names)}")
        return super().__new__(cls)
