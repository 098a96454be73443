"""Learning benchmark: gain in task reward per trainer family over N seeds on the built-in cooperative task.

    python benchmarks/learning.py --seeds 3                       # every family, seeds 0-2
    python benchmarks/learning.py --seeds 10 --families marlhf marlhf_iter
    python benchmarks/learning.py --seed-list 4 7 --families madpo --json out.jsonl

Each run builds the family's recipe (benchmarks/recipes.py, the same definitions the learning tests use) on
the embedded tiny model, measures the mean task reward on the 8 held-out items (8 samples each, fixed
evaluation streams) before and after training, and reports the gain. Per family: seeds, mean gain, min, max,
spread (standard deviation over seeds), wins (gain > 0), passes (gain > --margin, the learning tests'
assertion) and mean wall seconds per run. torch runs with one thread (--threads) for steadier timings.
This script only runs ours; CoMLRL's gain on the madpo and magrpo_2turn recipes (same task, evaluation
and initial weights) comes from `benchmarks/vs_comlrl.py --learning`, which needs the `bench` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _parse(argv: list[str] | None) -> argparse.Namespace:
    from recipes import RECIPES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per family (default 3)")
    p.add_argument("--seed-list", type=int, nargs="+", default=None, help="explicit seeds (overrides --seeds)")
    p.add_argument("--families", nargs="+", default=list(RECIPES), choices=list(RECIPES),
                   help="trainer families (default: all)")
    p.add_argument("--margin", type=float, default=0.3, help="gain a run must exceed to pass (default 0.3)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--json", default=None, help="append one JSON line per run to this file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="OPTION=VALUE",
                   help="override a config option of every recipe run, e.g. --set reference_kl_coef=0.05 "
                        "(VALUE is read as JSON when it parses, else as a string); repeatable")
    return p.parse_args(argv)


def parse_overrides(pairs: list[str]) -> dict:
    """``["a=1", "b=true", "c=x"]`` -> ``{"a": 1, "b": True, "c": "x"}`` (JSON values, else strings)."""
    out = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects OPTION=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def summarize(runs: list[dict], margin: float) -> dict:
    """Per-family statistics of the gains: n, mean, min, max, spread (population std), wins, passes, seconds."""
    gains = [r["gain"] for r in runs]
    return {"n": len(gains), "before": statistics.mean(r["before"] for r in runs), "mean": statistics.mean(gains),
            "min": min(gains), "max": max(gains), "spread": statistics.pstdev(gains),
            "wins": sum(g > 0 for g in gains), "passes": sum(g > margin for g in gains),
            "seconds": statistics.mean(r["seconds"] for r in runs)}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    for k, v in (("WANDB_MODE", "disabled"), ("HF_HUB_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(k, v)
    import logging
    import warnings

    import torch
    from recipes import run_recipe

    from comlrl_lightning.tiny import build_tiny_model

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(args.threads)
    overrides = parse_overrides(args.overrides)
    seeds = args.seed_list if args.seed_list is not None else list(range(args.seeds))
    start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny")
        for family in args.families:
            runs = []
            for seed in seeds:
                r = run_recipe(family, model_dir, seed, str(Path(tmp) / f"{family}_{seed}"), **overrides)
                r.pop("reward_fits", None) if not args.json else None
                runs.append(r)
                print(f"{family:13s} seed {seed:2d}: before {r['before']:.3f} after {r['after']:.3f} "
                      f"gain {r['gain']:+.3f} ({r['seconds']:.0f} s)", flush=True)
                if args.json:
                    with open(args.json, "a") as fh:
                        fh.write(json.dumps(r) + "\n")
            rows.append((family, summarize(runs, args.margin), [r["gain"] for r in runs]))
    print(f"\nTask-reward gain on the held-out items, torch {torch.__version__}, threads={args.threads}, "
          f"seeds {seeds}, pass = gain > {args.margin}")
    print(f"{'family':13s} {'n':>3s} {'before':>7s} {'mean':>7s} {'min':>7s} {'max':>7s} {'spread':>7s} "
          f"{'wins':>5s} {'pass':>5s} {'s/run':>6s}")
    for family, s, gains in rows:
        print(f"{family:13s} {s['n']:3d} {s['before']:7.3f} {s['mean']:+7.3f} {s['min']:+7.3f} {s['max']:+7.3f} "
              f"{s['spread']:7.3f} {s['wins']:5d} {s['passes']:5d} {s['seconds']:6.0f}   "
              + " ".join(f"{g:+.2f}" for g in gains))
    print(f"total {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
