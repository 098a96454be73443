"""The same training job in CoMLRL 1.4.3 and here: MADPO, 1- and 2-turn MAGRPO, wall and CPU time, ratio CoMLRL/ours.

Needs ``comlrl==1.4.3``: the ``bench`` extra, in a separate environment (``bash benchmarks/make_bench_env.sh``
builds ``.venv-bench``; benchmarks/README.md). Without it the script says how to install it and exits with status 2.

    python benchmarks/vs_comlrl.py                    # both jobs, 2 repetitions each, libraries alternating
    python benchmarks/vs_comlrl.py --jobs madpo --repeats 3
    python benchmarks/vs_comlrl.py --learning         # also the task-reward gain of each library's trained team
    python benchmarks/vs_comlrl.py --jobs magrpo1 --learning --repeats 1 --seeds 0 1 2 3   # learning over seeds
    python benchmarks/vs_comlrl.py --model 30m --jobs magrpo2 --repeats 1   # a 31.8 M model instead of the tiny one
    python benchmarks/vs_comlrl.py --comlrl-threads 1 --agent-overlap off   # both on one thread (CPU-time verdict)

The jobs are the recipes of ``benchmarks/recipes.py`` (those of the learning tests and ``learning.py``), on the
embedded tiny model (``comlrl_lightning.tiny.build_tiny_model`` writes it as a local checkpoint directory; both
libraries load it from that path), the built-in cooperative task's train items, its two formatters and its
reward function (``comlrl_lightning.envs.cooperative``):

  madpo   offline MADPO on 20 items: 16 joint candidates per item from the initial policy, the 8 largest-gap
          pairs per item (``reward_gap``), then 5 DPO epochs over the 160 pairs in batches of 16.
  magrpo1 1-turn MAGRPO on 20 items: 2 agents, G = 8, aligned, one AdamW step per item and agent, 1 epoch.
  magrpo2 2-turn MAGRPO on 8 items: 2 agents, G = 4, aligned joint actions, ``plain_transition`` (ours; CoMLRL
          gets the same callable), early termination off, ``rollout_buffer_size=1`` (an AdamW step per node
          sample: 5 nodes x 2 agents per item), 1 epoch.

Every option the two libraries share is copied from our trainer's config into CoMLRL's (so CoMLRL's differing
defaults, e.g. ``early_termination_threshold=-0.2`` and ``num_turns``, cannot leak in), except ``top_k=None``,
which CoMLRL gets as ``top_k=0``: CoMLRL leaves an unset ``top_k`` out of ``generate``, where transformers then
applies its default top-k of 50, while ours samples without a top-k filter; ours alone has ``seed``,
for CoMLRL the script seeds ``random``, ``numpy`` and ``torch`` with the same value before its job. The
timed region is ``train()`` on both sides (rollouts/collection, rewards, updates); loading the models and
building the trainers are not timed. Both run in one process; repetitions alternate the libraries so a slow phase
hits both. Each library gets the whole machine with its best settings for the model (issue #25; ``BEST``), which
``--comlrl-threads`` and ``--agent-overlap`` override. On ``30m``, where the matrix products take the time: CoMLRL
with every core as torch threads (its agents take turns, so intra-op threads are how it uses a second core), ours
with ``--threads`` (default 1) and ``agent_overlap="on"`` (a worker thread per agent for a level's generation calls
and a drain's updates, docs/architecture.md "Devices"; on a CPU ``auto`` would not overlap). On ``tiny``, where
Python takes the time, one thread each and no overlap: measured on the 2-core machine, 2 torch threads made CoMLRL's
2-turn job ~10x slower (71 CPU-s against 6), and overlap gains nothing on the tiny model (benchmarks/README.md,
``overlap.py``).

Equivalence is checked by counting, during each timed run: ``generate`` calls and the sequences they return
(samples), forward calls outside ``generate`` with their rows and token positions (the scoring forwards of the
updates), and optimizer steps (a global ``torch.optim`` step hook). Generate calls and samples must match
per item (MAGRPO: CoMLRL calls ``generate`` once per agent per tree node, 10 per item; ours once per agent
per tree level, 4 per item; same 40 samples). What cannot be matched and is left as each library does it:

* scoring: CoMLRL scores one row per forward; its MADPO runs the two-pass formulation (a no-grad pass for
  the other agents' margins, then a graded pass per agent), ours one forward per agent per batch and one
  backward of the joint loss (the same gradient, docs/preference.md §7.1), so CoMLRL's MADPO scores twice the rows.
  CoMLRL's MAGRPO scores the whole ``max_new_tokens`` completion, padding after EOS included; ours stops at
  the first EOS (docs/decisions.md, decision 4). Token positions (``fwd tok``) include the padding of
  batched rows, which single rows do not have.
* random streams: the same seed does not give the two libraries the same samples (different sampling code
  paths), so the lengths of the sampled completions, hence the scored tokens, differ between them (each
  library repeats its own samples run after run).
* ours runs under a Lightning ``Trainer`` (CPU accelerator, no logger, no checkpoints, no Lightning progress
  bar);
  CoMLRL's progress bars are switched off (``verbose=False``) and it has no W&B run.

Printed per job and library: median wall seconds and CPU seconds of ``train()``, the counts (medians), the
seconds inside ``generate``, then the ratios CoMLRL/ours of CPU and wall time, measured in this run, and the load
average before every run. The targets (issue #25: 2-turn MAGRPO >= 3x on the tiny model, >= 2.5x on 30m; MADPO >= 3x,
issue #11) are judged on wall time when the settings give a library more than one thread (CPU time then counts
every core's seconds, so it stops measuring time to result), and on CPU time when both run one thread without
overlap (``--comlrl-threads 1 --agent-overlap off``; it leaves out the time the process waited for a core, so it
holds on a shared machine where wall time does not). ``--learning`` adds the
mean task reward on the 8 held-out items (8 samples each, the fixed streams of ``recipes.evaluate``) before and
after training, for ours and for CoMLRL's trained weights loaded into our evaluation (same initial weights,
so "before" is shared).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

COMLRL_VERSION = "1.4.3"
TARGETS = {("madpo", "tiny"): 3.0, ("madpo", "30m"): 3.0, ("magrpo2", "tiny"): 3.0, ("magrpo2", "30m"): 2.5,
           ("magrpo1", "tiny"): 1.0, ("magrpo1", "30m"): 1.0}
JOBS = ("madpo", "magrpo2", "magrpo1")
#: --learning over --seeds: ours must gain at least CoMLRL's mean gain minus this (issue #31 item 9)
LEARNING_SLACK = 0.01
BEST = {  # each library's best settings on the model (module docstring)
    "30m": {"comlrl_threads": os.cpu_count() or 1, "agent_overlap": "on"},
    "tiny": {"comlrl_threads": 1, "agent_overlap": "off"},
}
MISSING = (f"benchmarks/vs_comlrl.py needs comlrl=={COMLRL_VERSION}, which is not importable here.\n"
           "Install the `bench` extra in a separate environment so the main one stays clean:\n"
           "  bash benchmarks/make_bench_env.sh    # builds .venv-bench; or by hand:\n"
           "  python -m venv .venv-bench\n"
           "  .venv-bench/bin/pip install -c constraints.txt torch==2.13.0   # keeps the CPU torch build\n"
           "  .venv-bench/bin/pip install -c constraints.txt -e \".[dev,bench]\"\n"
           "  .venv-bench/bin/python benchmarks/vs_comlrl.py")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", nargs="+", default=list(JOBS[:2]), choices=JOBS,
                   help="jobs to run (default: madpo magrpo2)")
    p.add_argument("--repeats", type=int, default=2, help="timed runs per job and library, alternating (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads of ours (default 1)")
    p.add_argument("--comlrl-threads", type=int, default=None,
                   help=f"torch intra-op threads of CoMLRL (default: 30m every core, here {os.cpu_count()}; tiny 1)")
    p.add_argument("--agent-overlap", choices=("on", "off", "auto"), default=None,
                   help="ours: agent_overlap (default: 30m on, a worker thread per agent; tiny off)")
    p.add_argument("--seed", type=int, default=0, help="seed of every run (default 0)")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="run every job once per seed (overrides --seed); with --learning prints the gains per seed, "
                        "their means, and judges ours >= CoMLRL - 0.01 on the mean")
    p.add_argument("--rollout-buffer-size", type=int, default=None,
                   help="magrpo2 on both sides with this rollout_buffer_size (= train_batch_size); default the "
                        "recipe's 1")
    p.add_argument("--model", choices=("tiny", "30m"), default="tiny",
                   help="tiny: the embedded model (default); 30m: benchmarks/engine.py's 31.8 M random Qwen2, where "
                        "the matrix products, not Python, take the time (its --learning gains mean little)")
    p.add_argument("--learning", action="store_true",
                   help="also evaluate each library's trained team on the held-out items (untimed)")
    p.add_argument("--strict", action="store_true", help="exit with status 1 when a ratio misses the target")
    args = p.parse_args(argv)
    args.seeds = args.seeds or [args.seed]
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.rollout_buffer_size is not None and args.rollout_buffer_size < 1:
        p.error(f"--rollout-buffer-size must be >= 1, got {args.rollout_buffer_size}")
    best = BEST[args.model]
    if args.comlrl_threads is None:
        args.comlrl_threads = best["comlrl_threads"]
    if args.agent_overlap is None:
        args.agent_overlap = best["agent_overlap"]
    for name in ("threads", "comlrl_threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def comlrl_version() -> str | None:
    """The installed comlrl version, or None when the package is not importable."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("comlrl") is None:
        return None
    try:
        return importlib.metadata.version("comlrl")
    except importlib.metadata.PackageNotFoundError:
        return None


class Counts:
    """Work done inside a timed run: generate calls/samples, scoring forwards/rows/positions, optimizer steps,
    and the wall seconds spent inside ``generate``."""

    FIELDS = ("gen_calls", "samples", "fwd_calls", "fwd_rows", "fwd_tokens", "opt_steps", "gen_s")

    def __init__(self):
        for f in self.FIELDS:
            setattr(self, f, 0)
        self._in_generate = 0

    def as_dict(self) -> dict[str, float]:
        return {f: round(getattr(self, f), 3) for f in self.FIELDS}


@contextmanager
def counting(counts: Counts):
    """Patch ``GenerationMixin.generate``, the tiny model's ``forward`` and a global optimizer step hook."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from transformers import Qwen2ForCausalLM
    from transformers.generation.utils import GenerationMixin

    gen, fwd = GenerationMixin.generate, Qwen2ForCausalLM.forward

    def generate(self, *a, **kw):
        counts._in_generate += 1
        t0 = time.perf_counter()
        try:
            out = gen(self, *a, **kw)
        finally:
            counts._in_generate -= 1
            counts.gen_s += time.perf_counter() - t0
        seqs = out if isinstance(out, torch.Tensor) else out.sequences
        counts.gen_calls += 1
        counts.samples += int(seqs.shape[0])
        return out

    def forward(self, input_ids=None, *a, **kw):
        if not counts._in_generate and input_ids is not None:
            counts.fwd_calls += 1
            counts.fwd_rows += int(input_ids.shape[0])
            counts.fwd_tokens += int(input_ids.numel())
        return fwd(self, input_ids, *a, **kw)

    def on_step(optimizer, args, kwargs):
        counts.opt_steps += 1

    GenerationMixin.generate, Qwen2ForCausalLM.forward = generate, forward
    handle = register_optimizer_step_post_hook(on_step)
    try:
        yield counts
    finally:
        GenerationMixin.generate, Qwen2ForCausalLM.forward = gen, fwd
        handle.remove()


def timed(fn) -> tuple[float, float, dict[str, int]]:
    """(wall s, process CPU s, counts) of ``fn()``."""
    counts = Counts()
    with counting(counts):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, counts.as_dict()


def ours_trainer(job: str, model_dir: str, seed: int, root: str, overrides: dict | None = None):
    """Our trainer of the job: the recipe of benchmarks/recipes.py (MADPO; 2-turn MAGRPO), with ``overrides``
    of its config options."""
    from recipes import madpo, magrpo, magrpo_2turn

    return {"madpo": madpo, "magrpo1": magrpo, "magrpo2": magrpo_2turn}[job](model_dir, seed, root,
                                                                               **(overrides or {}))


def comlrl_trainer(job: str, ours, model_dir: str):
    """CoMLRL's trainer of the same job: every option both configs have is copied from ours."""
    from comlrl.trainers import MADPOConfig, MADPOTrainer, MAGRPOConfig, MAGRPOTrainer

    from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
    from comlrl_lightning.multiturn.transitions import plain_transition

    config_cls, trainer_cls = (MADPOConfig, MADPOTrainer) if job == "madpo" else (MAGRPOConfig, MAGRPOTrainer)
    shared = {f.name: getattr(ours.args, f.name) for f in dataclasses.fields(config_cls)
              if hasattr(ours.args, f.name)}
    shared.update(parallel_training="none", agent_devices=None, reference_devices=None)  # CPU, one process
    if shared.get("top_k", 0) is None:  # ours: None = no top-k filter; CoMLRL: None = transformers' default 50
        shared["top_k"] = 0
    kw = dict(agent_model=model_dir, num_agents=ours.args.num_agents, train_dataset=list(ours.datamodule.train_items),
              reward_func=cooperative_reward, formatters=FORMATTERS, args=config_cls(**shared))
    if ours.args.num_turns > 1:
        kw["external_transition"] = plain_transition
    tr = trainer_cls(**kw)
    tr.verbose = False  # no tqdm bars (ours runs with enable_progress_bar=False)
    return tr


def _seed_all(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_job(job: str, model_dir: str, args, tmp: str) -> dict:
    """Alternate ``--repeats`` timed runs of ours and CoMLRL's; returns the runs and the learning results.
    With several ``--seeds``, the runs of every seed and the learning results per seed."""
    out = {"runs": {"comlrl": [], "ours": []}, "learning": {}}
    for seed in args.seeds:
        res = run_seed(job, model_dir, args, tmp, seed)
        for lib in out["runs"]:
            out["runs"][lib] += res["runs"][lib]
        if res["learning"]:
            out["learning"][seed] = res["learning"]
    return out


def run_seed(job: str, model_dir: str, args, tmp: str, seed: int) -> dict:
    """The runs of one seed."""
    import torch
    from recipes import evaluate

    overrides = {"agent_overlap": args.agent_overlap}
    if job == "magrpo2" and args.rollout_buffer_size:
        overrides["rollout_buffer_size"] = args.rollout_buffer_size
    runs = {"comlrl": [], "ours": []}
    learn = {}
    for rep in range(args.repeats):
        for lib in ("ours", "comlrl"):
            ours = ours_trainer(job, model_dir, seed, str(Path(tmp) / f"{job}_{lib}_{seed}_{rep}"), overrides)
            evaluate_now = args.learning and rep == 0
            torch.set_num_threads(args.threads if lib == "ours" else args.comlrl_threads)
            load = os.getloadavg()[0]
            if evaluate_now and "before" not in learn:
                learn["before"] = evaluate(ours)
            if lib == "ours":
                wall, cpu, counts = timed(ours.train)
            else:
                theirs = comlrl_trainer(job, ours, model_dir)
                _seed_all(seed)
                wall, cpu, counts = timed(theirs.train)
                if evaluate_now:  # CoMLRL's trained weights into our (untrained) team, for the same evaluation
                    for mine, trained in zip(ours.team.models, theirs.agents):
                        mine.load_state_dict(trained.state_dict())
                del theirs
            if evaluate_now:
                learn[lib] = evaluate(ours)
            counts["threads"] = torch.get_num_threads()
            runs[lib].append((wall, cpu, counts))
            print(f"{job:8s} {lib:7s} seed {seed} run {rep + 1}: wall {wall:7.2f} s  cpu {cpu:7.2f} s  load before "
                  f"{load:.2f}  {counts}", flush=True)
    return {"runs": runs, "learning": learn}


def judged_on(args) -> str:
    """"cpu" when both libraries run one thread without overlap, else "wall" (module docstring)."""
    return "cpu" if args.threads == 1 and args.comlrl_threads == 1 and args.agent_overlap == "off" else "wall"


def report(results: dict[str, dict], args, version: str, uptime: str) -> bool:
    """Print the summary table; True when every ratio meets the target."""
    import torch

    print(f"\nCoMLRL {version} vs comlrl-lightning, the same jobs (benchmarks/recipes.py), torch {torch.__version__}, "
          f"model {args.model}, threads: CoMLRL {args.comlrl_threads}, ours {args.threads} with agent_overlap="
          f"{args.agent_overlap}; {args.repeats} run(s) per library and seed, seeds {args.seeds}; load before: "
          f"{uptime}")
    head = (f"{'job':9s}{'library':9s}{'wall s':>8s}{'cpu s':>8s}{'gen calls':>10s}{'samples':>8s}"
            f"{'fwd calls':>10s}{'fwd rows':>9s}{'fwd tok':>9s}{'opt steps':>10s}{'gen s':>8s}")
    print(head)
    ok = True
    for job, res in results.items():
        med = {}
        for lib in ("comlrl", "ours"):
            runs = res["runs"][lib]
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            c = {k: statistics.median(r[2][k] for r in runs) for k in Counts.FIELDS}
            med[lib] = (wall, cpu)
            print(f"{job:9s}{lib:9s}{wall:8.2f}{cpu:8.2f}{c['gen_calls']:10.0f}{c['samples']:8.0f}"
                  f"{c['fwd_calls']:10.0f}{c['fwd_rows']:9.0f}{c['fwd_tokens']:9.0f}{c['opt_steps']:10.0f}"
                  f"{c['gen_s']:8.2f}")
        r_wall, r_cpu = med["comlrl"][0] / med["ours"][0], med["comlrl"][1] / med["ours"][1]
        target, on = TARGETS[(job, args.model)], judged_on(args)
        passed = (r_cpu if on == "cpu" else r_wall) >= target
        ok &= passed
        print(f"{job:9s}CoMLRL/ours: wall {r_wall:.2f}x, cpu {r_cpu:.2f}x  target >= {target:g}x on {on} time  "
              f"{'PASS' if passed else 'FAIL'}")
        if res["learning"]:
            ok &= learning_lines(job, res["learning"])
    return ok


def learning_lines(job: str, by_seed: dict[int, dict]) -> bool:
    """Print the task-reward gains per seed and their means; True when ours >= CoMLRL - LEARNING_SLACK on the mean
    (judged only with more than one seed)."""
    gains = {lib: [ln[lib] - ln["before"] for ln in by_seed.values()] for lib in ("ours", "comlrl")}
    for seed, ln in by_seed.items():
        print(f"{job:9s}seed {seed}: task reward on the held-out items before {ln['before']:.3f}; after ours "
              f"{ln['ours']:.3f} (gain {ln['ours'] - ln['before']:+.3f}), after CoMLRL {ln['comlrl']:.3f} "
              f"(gain {ln['comlrl'] - ln['before']:+.3f})")
    mean = {lib: statistics.mean(g) for lib, g in gains.items()}
    if len(by_seed) < 2:
        return True
    passed = mean["ours"] >= mean["comlrl"] - LEARNING_SLACK
    print(f"{job:9s}mean gain over {len(by_seed)} seeds: ours {mean['ours']:+.3f}, CoMLRL {mean['comlrl']:+.3f}  "
          f"target ours >= CoMLRL - {LEARNING_SLACK}  {'PASS' if passed else 'FAIL'}")
    return passed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    version = comlrl_version()
    if version is None:
        print(MISSING, file=sys.stderr)
        return 2
    if version != COMLRL_VERSION:
        print(f"warning: comlrl {version} is installed; the comparison is written against {COMLRL_VERSION}",
              file=sys.stderr)
    for k, v in (("WANDB_MODE", "disabled"), ("HF_HUB_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(k, v)
    import logging
    import warnings

    import transformers

    from comlrl_lightning.tiny import build_tiny_model

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    transformers.utils.logging.disable_progress_bar()
    uptime = " ".join(os.popen("uptime").read().split()[-3:]) if sys.platform != "win32" else "?"
    start = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory(prefix="vs_comlrl_") as tmp:
        if args.model == "tiny":
            model_dir = build_tiny_model(Path(tmp) / "tiny")
        else:
            from engine import build_model
            model_dir = build_model(args.model, Path(tmp))
        for job in args.jobs:
            results[job] = run_job(job, model_dir, args, tmp)
    ok = report(results, args, version, uptime)
    print(f"total {time.perf_counter() - start:.0f} s")
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
