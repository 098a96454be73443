"""``comlrl-lightning report <run folder>``: PNG plots of a run's logged metrics (matplotlib, no W&B needed).

Reads the run's ``metrics.csv`` (Lightning's ``CSVLogger``, which every config under ``configs/`` uses) and
writes into ``<run>/plots/``:

* ``rewards.png``: task and training rewards against the logged step (``eval/reward_mean``,
  ``turn_{t}/reward_mean``, ``turn_{t}/expected_return``, ``round/candidate_reward_mean``, ...), titled by what
  each measures (eval items, training samples, a round's candidates);
* ``losses.png``: one panel per kind of loss (``train/loss``, ``train/agent{i}/actor_loss``,
  ``train/agent{i}/value_loss``, ...) and one for the ``*accuracy`` keys;
* ``rounds.png`` (iterative runs): ``round/win_rate`` and ``round/tie_rate`` per round, with the new pairs per
  round (``round/num_pairs``) on a second panel.

A plot is written only when the run logged at least one of its keys. ``<run folder>`` may be the versioned
folder (``outputs/madpo_tiny/lightning_logs/version_0``) or any folder above it (the newest training run below it
is used, not a later ``validate``/``test`` run). Every figure's title names the run folder and whether it trained.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from pathlib import Path


def find_metrics(run: str | Path) -> Path:
    """``run/metrics.csv``, else the training run below ``run``: the newest ``metrics.csv`` that logged a training
    metric (``train/*``, ``round/*`` or a loss), so that a later ``validate``/``test`` run or an empty run beside it
    is not picked; without one, the newest file with any metric. A clear error when there is none."""
    run = Path(run)
    if run.is_file() and run.name.endswith(".csv"):
        return run
    if (run / "metrics.csv").exists():
        return run / "metrics.csv"
    found = sorted(run.rglob("metrics.csv"), key=lambda p: p.stat().st_mtime) if run.is_dir() else []
    if not found:
        raise FileNotFoundError(f"No metrics.csv under {str(run)!r}. Pass a run folder written by a CSVLogger "
                                "(e.g. outputs/madpo_tiny/lightning_logs/version_0).")
    keys = {p: set(read_metrics(p)) for p in found}
    training = [p for p in found if any(_is_training(k) for k in keys[p])]
    return (training or [p for p in found if keys[p]] or found)[-1]


def _is_training(key: str) -> bool:
    return key.startswith(("train/", "round/")) or key.endswith("loss")


def read_metrics(path: str | Path) -> dict[str, list[tuple[float, float]]]:
    """``{key: [(step, value), ...]}`` of every numeric column of a CSVLogger file (empty cells skipped)."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                step = float(row.get("step") or "nan")
            except ValueError:
                step = math.nan
            for key, text in row.items():
                if key in ("step", "epoch") or not text:
                    continue
                try:
                    value = float(text)
                except ValueError:
                    continue
                if math.isfinite(value):
                    series[key].append((step, value))
    return dict(series)


def _is_reward(key: str) -> bool:
    return key.endswith(("reward_mean", "expected_return")) and "reward_distribution" not in key


def describe_reward(key: str) -> str:
    """What a reward key measures, for the plot's legend and title."""
    if key.startswith(("eval/", "val/", "test/")):
        return "task reward on the eval items"
    if key.startswith("round/"):
        return "task reward of the round's sampled candidates"
    return "task reward of the training samples (MADPO: the candidates behind the batch's pairs)"


def plot_plan(series: dict) -> dict[str, list[tuple[str, str, list[str]]]]:
    """``{file name: [(panel title, y label, keys), ...]}`` of the reward and loss figures for ``series``' keys:
    the rewards (a key equal to one already plotted is left out, e.g. ``eval/turn_1/*`` = ``eval/reward_mean``),
    titled by what they measure; one panel per kind of loss (``train/loss``, ``actor_loss``, ``value_loss``, ...:
    losses of different scales never share an axis) and one for the accuracies."""
    plan: dict[str, list[tuple[str, str, list[str]]]] = {}
    rewards: list[str] = []
    for k in sorted(series, key=lambda k: (not k.startswith("eval/"), k.count("/"), k)):
        if _is_reward(k) and all(series[k] != series[r] for r in rewards):
            rewards.append(k)
    if rewards:
        kinds = list(dict.fromkeys(describe_reward(k) for k in rewards))
        title = "; ".join(f"{d} ({', '.join(k for k in rewards if describe_reward(k) == d)})" for d in kinds)
        plan["rewards.png"] = [("rewards: " + title, "reward", rewards)]
    kinds_of_loss: dict[str, list[str]] = defaultdict(list)
    for k in sorted(series):
        if k.endswith("loss"):
            kinds_of_loss[k.rsplit("/", 1)[-1]].append(k)
    panels = [(f"{kind}: {', '.join(keys)}", kind, keys) for kind, keys in sorted(kinds_of_loss.items())]
    accuracies = sorted(k for k in series if k.endswith("accuracy"))
    if accuracies:
        panels.append((f"accuracy: {', '.join(accuracies)}", "accuracy", accuracies))
    if panels:
        plan["losses.png"] = panels
    return plan


def _panel(ax, series: dict, keys: list[str], ylabel: str, xlabel: str = "step") -> None:
    for key in keys:
        points = series[key]
        xs = [x for x, _ in points]
        ys = [y for _, y in points]
        ax.plot(xs, ys, marker="o" if len(points) <= 30 else None, markersize=3, label=key)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def render_report(run: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write the PNG plots of ``run`` (see the module docstring); returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    metrics = find_metrics(run)
    series = read_metrics(metrics)
    out = Path(out_dir) if out_dir is not None else metrics.parent / "plots"
    out.mkdir(parents=True, exist_ok=True)
    kind = "training run" if any(_is_training(k) for k in series) else "evaluation-only run"
    title = f"{metrics.parent} ({kind})"
    written: list[Path] = []

    def save(fig, name: str) -> None:
        fig.suptitle(title, fontsize=8)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    for name, panels in plot_plan(series).items():
        fig, axes = plt.subplots(len(panels), 1, figsize=(8, 3.5 * len(panels) + 1), squeeze=False)
        for ax, (panel_title, label, keys) in zip(axes[:, 0], panels):
            _panel(ax, series, keys, label)
            ax.set_title(panel_title, fontsize=8, wrap=True)
        save(fig, name)

    if "round/win_rate" in series:
        by_round = {}
        index = dict(series.get("round/index", []))  # step -> round index (logged in the same row)
        for key in ("round/win_rate", "round/tie_rate", "round/num_pairs"):
            by_round[key] = [(index.get(step, i), v) for i, (step, v) in enumerate(series.get(key, []))]
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6))
        rates = {k: v for k, v in by_round.items() if k != "round/num_pairs" and v}
        _panel(ax1, rates, sorted(rates), "share of comparisons", "round")
        ax1.set_ylim(-0.02, 1.02)
        ax1.axhline(0.5, color="grey", lw=0.8, ls="--")
        ax1.set_title("current agents vs comparator, per round", fontsize=9)
        pairs = by_round["round/num_pairs"]
        ax2.bar([x for x, _ in pairs], [y for _, y in pairs], color="tab:green")
        ax2.set_xlabel("round")
        ax2.set_ylabel("new pairs (round/num_pairs)")
        ax2.grid(alpha=0.3)
        for ax in (ax1, ax2):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        save(fig, "rounds.png")
    if not written:
        raise ValueError(f"{metrics} has no reward, loss or round metric to plot (keys: {sorted(series)}).")
    return written


def main(argv: list[str] | None = None) -> None:
    """``comlrl-lightning report <run folder> [--out DIR]``."""
    parser = argparse.ArgumentParser(prog="comlrl-lightning report", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a run folder (with metrics.csv) or a folder above it")
    parser.add_argument("--out", default=None, help="where the PNG files go (default: <run>/plots)")
    ns = parser.parse_args(argv)
    try:
        paths = render_report(ns.run, ns.out)
    except (FileNotFoundError, ValueError) as exc:
        parser.exit(2, f"error: {exc}\n")
    for p in paths:
        print(p)
