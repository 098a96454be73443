"""Config learning benchmark: every shipped learning config under configs/, run through the CLI as shipped, on N seeds.

    python benchmarks/configs_learn.py                                   # every learning config, seeds 0-9
    python benchmarks/configs_learn.py --configs magrpo/tiny --seeds 3   # seeds 0-2
    python benchmarks/configs_learn.py --seed-list 3 4 5 --json runs.jsonl --strict

One process per run, one run after another: ``comlrl-lightning fit --config configs/<name>.yaml`` with only the
seed (``--seed_everything``, the module's ``seed`` and the data module's ``seed``) and the output folder
(``trainer.logger.init_args.save_dir``, ``trainer.default_root_dir``) overridden. Nothing else is changed.

Gain, read from the run's ``metrics.csv``:

* task-reward configs: ``eval/reward_mean`` on the config's held-out items (``TaskRewardEvaluation``), first
  evaluation (before the first update) to last (after training);
* ``reward_model/tiny``: ``val/reward_model/accuracy`` on the held-out pairs, measured by
  ``comlrl-lightning validate`` on the untrained config (before, a second process) and by the fit's last
  validation (after).

A run "wins" when its gain exceeds the config's margin (``MARGINS``). The table gives, per config: margin, seeds
won, mean / min / max gain and wall seconds per run (the fit; plus the validate for the reward model).
``--strict`` exits 1 when a config wins on fewer than all its seeds. Runs use one torch thread
(``OMP_NUM_THREADS=1`` unless set), as ``benchmarks/learning.py``.

Left out: the hub configs (Qwen2.5-Coder-3B and other hub models: downloads and GPUs), the packaged SmolLM2
``*_cpu`` variants (minutes to hours per run on a CPU), and ``magrpo/code_plain_tiny`` /
``magrpo/code_level_feedback_tiny`` (their headers say it: the embedded tiny model never writes parseable code, the
task reward stays 0 -> 0; they check plumbing, not learning).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# config (path under configs/, no .yaml) -> the gain a seed must exceed: above what evaluation noise gives (8 held-out
# items x 4-8 samples: about 0.04 of task reward), well below the recipes' gains (README, "Learning benchmark").
# 0.05 where a config's slowest seeds gain about 0.1 (iac/tiny: +0.09 and +0.12 where the others gain about 0.5).
# Measured as shipped: benchmarks/README.md, "configs_learn.py".
MARGINS: dict[str, float] = {
    "madpo/tiny": 0.1,
    "madpo/iterative_tiny": 0.1,
    "magrpo/tiny": 0.3,
    "magrpo/multiturn_tiny": 0.1,
    "magrpo/multiturn_cross_tiny": 0.1,
    "magrpo/centralized_tiny": 0.1,
    "iac/tiny": 0.05,
    "maac/tiny": 0.1,
    "marlhf/tiny": 0.1,
    "marlhf/iterative_tiny": 0.1,
    "reward_model/tiny": 0.1,
}
# configs whose gain is held-out accuracy of a reward model (module seed is a direct init arg, not args.seed)
ACCURACY_CONFIGS = {"reward_model/tiny"}
EXCLUDED = {
    "magrpo/code_plain_tiny": "task reward 0 -> 0 by design: the tiny model writes no parseable code (header)",
    "magrpo/code_level_feedback_tiny": "task reward 0 -> 0 by design: the tiny model writes no parseable code",
}


def _metric(name: str) -> str:
    return "val/reward_model/accuracy" if name in ACCURACY_CONFIGS else "eval/reward_mean"


def _overrides(name: str, seed: int, out: Path) -> list[str]:
    model_seed = "--model.init_args.seed" if name in ACCURACY_CONFIGS else "--model.init_args.args.seed"
    return ["--seed_everything", str(seed), model_seed, str(seed), "--data.init_args.seed", str(seed),
            "--trainer.logger.init_args.save_dir", str(out), "--trainer.default_root_dir", str(out)]


def _cli(subcommand: str, name: str, seed: int, out: Path, log) -> None:
    cmd = [sys.executable, "-m", "comlrl_lightning", subcommand, "--config", str(ROOT / "configs" / f"{name}.yaml"),
           *_overrides(name, seed, out)]
    proc = subprocess.run(cmd, cwd=out.parent, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} seed {seed}: `{' '.join(cmd)}` exited {proc.returncode}; log: {log.name}")


def read_metric(out: Path, metric: str) -> list[float]:
    """Every logged value of ``metric`` in the run's ``metrics.csv`` files under ``out``, in logging order."""
    values: list[float] = []
    for path in sorted(out.rglob("metrics.csv")):
        with open(path, newline="") as f:
            values += [float(row[metric]) for row in csv.DictReader(f) if row.get(metric, "") != ""]
    return values


def run_config(name: str, seed: int, workdir: str | Path) -> dict:
    """Run ``configs/<name>.yaml`` through the CLI on ``seed`` (one subprocess per CLI call) under ``workdir``.

    Returns ``{"config", "seed", "metric", "before", "after", "gain", "seconds"}``. An earlier run's folder for the
    same config and seed under ``workdir`` is removed first."""
    if name not in MARGINS:
        raise ValueError(f"config={name!r} is not a learning config; allowed: {', '.join(MARGINS)}")
    work = Path(workdir) / f"{name.replace('/', '_')}_seed{seed}"
    if work.exists():  # a kept workdir's earlier run: its metrics.csv files would be read with this run's
        shutil.rmtree(work)
    work.mkdir(parents=True)
    metric = _metric(name)
    env_log = work / "run.log"
    t0 = time.perf_counter()
    with open(env_log, "w") as log:
        if name in ACCURACY_CONFIGS:
            _cli("validate", name, seed, work / "before", log)
            before = read_metric(work / "before", metric)[0]
        _cli("fit", name, seed, work / "fit", log)
    seconds = time.perf_counter() - t0
    values = read_metric(work / "fit", metric)
    if name not in ACCURACY_CONFIGS:
        if len(values) < 2:
            raise RuntimeError(f"{name} seed {seed}: {metric} logged {len(values)} time(s), need a first and a last "
                               f"evaluation; log: {env_log}")
        before = values[0]
    return {"config": name, "seed": seed, "metric": metric, "before": before, "after": values[-1],
            "gain": values[-1] - before, "seconds": seconds}


def summarize(runs: list[dict], margin: float) -> dict:
    """n, wins (gain > margin), mean / min / max gain, mean before, mean seconds per run."""
    gains = [r["gain"] for r in runs]
    return {"n": len(gains), "wins": sum(g > margin for g in gains), "mean": statistics.mean(gains),
            "min": min(gains), "max": max(gains), "before": statistics.mean(r["before"] for r in runs),
            "seconds": statistics.mean(r["seconds"] for r in runs)}


def table(results: dict[str, list[dict]]) -> str:
    """Markdown table: config, metric, margin, seeds won, mean / min / max gain, s / run."""
    lines = ["| config | metric | margin | seeds won | before | mean gain | min | max | s / run |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, runs in results.items():
        if not runs:
            continue
        s = summarize(runs, MARGINS[name])
        lines.append(f"| {name} | {_metric(name)} | {MARGINS[name]:.2f} | {s['wins']}/{s['n']} | {s['before']:.3f} "
                     f"| {s['mean']:+.3f} | {s['min']:+.3f} | {s['max']:+.3f} | {s['seconds']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 per config (default 10)")
    p.add_argument("--seed-list", type=int, nargs="+", default=None, help="explicit seeds (overrides --seeds)")
    p.add_argument("--configs", nargs="+", default=list(MARGINS), choices=list(MARGINS),
                   help="configs under configs/, without .yaml (default: every learning config)")
    p.add_argument("--workdir", default=None, help="keep the runs' folders here (default: a temporary folder)")
    p.add_argument("--json", default=None, help="append one JSON line per run to this file")
    p.add_argument("--strict", action="store_true", help="exit 1 when a config wins on fewer than all its seeds")
    p.add_argument("--table-from", nargs="+", default=None, metavar="JSONL",
                   help="run nothing: print the table of the runs saved by --json in these files")
    args = p.parse_args(argv)
    if args.table_from:
        saved: dict[str, list[dict]] = {}
        for path in args.table_from:
            for line in Path(path).read_text().splitlines():
                r = json.loads(line)
                saved.setdefault(r["config"], []).append(r)
        print(table({n: saved[n] for n in MARGINS if n in saved}))
        return 0
    seeds = args.seed_list if args.seed_list is not None else list(range(args.seeds))
    # one torch thread per run (as benchmarks/learning.py), unless OMP_NUM_THREADS is set: steadier timings
    for k, v in (("WANDB_MODE", "disabled"), ("HF_HUB_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false"),
                 ("OMP_NUM_THREADS", "1")):
        os.environ.setdefault(k, v)
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="configs_learn_") as tmp:
        workdir = args.workdir or tmp
        for name in args.configs:
            results[name] = []
            for seed in seeds:
                r = run_config(name, seed, workdir)
                results[name].append(r)
                print(f"{name} seed {seed}: {r['metric']} {r['before']:.3f} -> {r['after']:.3f} "
                      f"(gain {r['gain']:+.3f}, {r['seconds']:.0f} s)", flush=True)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(r) + "\n")
    print(table(results))
    missed = [n for n, runs in results.items() if summarize(runs, MARGINS[n])["wins"] < len(runs)]
    if missed:
        print(f"below margin on some seed: {', '.join(missed)}")
    return 1 if (args.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
