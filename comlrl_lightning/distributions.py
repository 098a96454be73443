"""Reward-distribution histograms of the iterative trainers (docs/preference.md §3.8): pure functions.

Bins are equal-width over the declared raw reward range [lo, hi] of ``reward_func.reward_range``; values are
clipped into [lo, hi], the last bin is closed (hi counts), non-finite values are dropped.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from comlrl_lightning.files import write_text_atomic

NUM_BINS = 16
COLORS = {"target": "#e87030", "comparator": "#6e6e6e"}
TITLES = {"candidate": "Candidate Reward Distribution", "selected": "Selected Preference Reward Distribution"}


def resolve_reward_range(fn: Callable) -> tuple[float, float]:
    """``fn.reward_range`` checked: a two-item sequence (not a str) of finite numbers with min < max."""
    rr = getattr(fn, "reward_range", None)
    if rr is None:
        raise ValueError("log_reward_distribution=True requires reward_func.reward_range to declare the raw reward "
                         "scale as (minimum, maximum). Use comlrl_lightning.rewards.set_reward_range(fn, lo, hi).")
    if isinstance(rr, (str, bytes)) or not isinstance(rr, Sequence) or len(rr) != 2:
        raise ValueError(f"reward_func.reward_range must be a two-item sequence: (minimum, maximum). Got {rr!r}.")
    try:
        lo, hi = float(rr[0]), float(rr[1])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"reward_func.reward_range values must be finite. Got {rr!r}.") from exc
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"reward_func.reward_range values must be finite. Got {rr!r}.")
    if not lo < hi:
        raise ValueError(f"reward_func.reward_range minimum must be less than maximum. Got {rr!r}.")
    return lo, hi


def bin_edges(lo: float, hi: float, num_bins: int = NUM_BINS) -> list[float]:
    """``num_bins + 1`` equal-width edges from lo to hi: e_k = lo + k·(hi − lo)/num_bins."""
    width = (hi - lo) / num_bins
    return [lo + k * width for k in range(num_bins)] + [hi]


def histogram(values: Sequence[float], lo: float, hi: float, num_bins: int = NUM_BINS) -> list[int]:
    """Counts per bin: bin k = ⌊(clip(v, lo, hi) − lo) / width⌋, with v = hi in the last bin."""
    counts = [0] * num_bins
    width = (hi - lo) / num_bins
    for v in values:
        v = float(v)
        if not math.isfinite(v):
            continue
        v = min(max(v, lo), hi)
        counts[min(int((v - lo) / width), num_bins - 1)] += 1
    return counts


def series(values: Sequence[float], lo: float, hi: float, num_bins: int = NUM_BINS) -> dict[str, Any]:
    """One series: ``sample_count``, ``mean`` (None when empty), ``counts`` and the finite ``raw_rewards``."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return {
        "sample_count": len(finite),
        "mean": sum(finite) / len(finite) if finite else None,
        "counts": histogram(finite, lo, hi, num_bins),
        "raw_rewards": finite,
    }


def distribution_record(iteration: int, lo: float, hi: float, candidate: dict[str, Sequence[float]],
                        selected: dict[str, Sequence[float]], num_bins: int = NUM_BINS) -> dict[str, Any]:
    """The JSON record of one round (1-based ``iteration``); no density key."""
    edges = bin_edges(lo, hi, num_bins)
    return {
        "iteration": int(iteration),
        "reward_min": lo,
        "reward_max": hi,
        "num_bins": num_bins,
        "bin_edges": edges,
        "bin_centers": [(edges[k] + edges[k + 1]) / 2 for k in range(num_bins)],
        "candidate": {s: series(candidate.get(s, []), lo, hi, num_bins) for s in ("target", "comparator")},
        "selected": {s: series(selected.get(s, []), lo, hi, num_bins) for s in ("target", "comparator")},
    }


def write_record(directory: str | os.PathLike, record: dict[str, Any]) -> Path | None:
    """Write ``iteration_{I:04d}.json`` (indent 2) atomically; nothing when every series is empty."""
    if not any(record[kind][s]["sample_count"] for kind in ("candidate", "selected") for s in ("target", "comparator")):
        return None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"iteration_{record['iteration']:04d}.json"
    return write_text_atomic(path, json.dumps(record, indent=2, ensure_ascii=False))


def svg_chart(record: dict[str, Any], kind: str, style: str) -> str:
    """A 240×80 SVG (``style`` "line" or "bar") of one distribution, axes labelled "reward" and "count"."""
    counts = {s: record[kind][s]["counts"] for s in ("target", "comparator")}
    top = max([1] + [c for v in counts.values() for c in v])
    n = record["num_bins"]
    x0, y0, w, h = 22.0, 8.0, 210.0, 56.0
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="240" height="80" viewBox="0 0 240 80">',
             f'<title>{TITLES[kind]}</title>',
             f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" stroke="#000"/>',
             f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + h}" stroke="#000"/>',
             f'<text x="{x0 + w / 2}" y="78" font-size="8" text-anchor="middle">reward</text>',
             f'<text x="6" y="{y0 + h / 2}" font-size="8" transform="rotate(-90 6 {y0 + h / 2})">count</text>']
    for i, (name, vals) in enumerate(counts.items()):
        color = COLORS[name]
        if style == "bar":
            bw = w / n / 2
            for k, c in enumerate(vals):
                bh = h * c / top
                parts.append(f'<rect x="{x0 + k * w / n + i * bw:.2f}" y="{y0 + h - bh:.2f}" width="{bw:.2f}" '
                             f'height="{bh:.2f}" fill="{color}"/>')
        else:
            pts = " ".join(f"{x0 + (k + 0.5) * w / n:.2f},{y0 + h - h * c / top:.2f}" for k, c in enumerate(vals))
            parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}"/>')
    parts.append("</svg>")
    return "".join(parts)


def round_metrics(record: dict[str, Any], kind: str, pair_count: int | None = None) -> dict[str, float]:
    """Scalar keys of docs/preference.md §3.8 for namespace ``iter/reward_distribution`` or
    ``iter/selected_reward_distribution``."""
    ns = "iter/reward_distribution" if kind == "candidate" else "iter/selected_reward_distribution"
    out = {f"{ns}/current_iteration": float(record["iteration"])}
    for s in ("target", "comparator"):
        out[f"{ns}/{s}_sample_count"] = float(record[kind][s]["sample_count"])
        if record[kind][s]["mean"] is not None:
            out[f"{ns}/{s}_mean"] = float(record[kind][s]["mean"])
    if kind == "selected" and pair_count is not None:
        out[f"{ns}/pair_count"] = float(pair_count)
    return out
