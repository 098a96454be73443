"""One tree level of generation for two agents: one after another (``agent_overlap="off"``) against at the same
time in two threads (``agent_overlap="on"``), measured in the same run (docs/architecture.md, "Devices"); with
``--fit``, also a whole MAGRPO fit, whose updates overlap too.

Run ``python benchmarks/overlap.py [--quick] [--models tiny,30m] [--threads 1] [--fit [--fit-job madpo]]``.

Models (random weights except the tiny one, built in a temporary folder; 2 full-model agents, each its own copy,
both on the CPU):

  tiny  the embedded default (``build_tiny_model``): Qwen2, 2 layers, hidden 64, 0.16 M parameters;
  30m   ``benchmarks/engine.py``'s 30m: Qwen2, 10 layers, hidden 512, 8 heads / 4 KV heads, 31.8 M parameters.

Workload per repetition: ``HFEngine.sample_many`` with one request per agent, ``--prompts`` prompts (the nodes
of a level) x ``--candidates`` samples, ``--tokens`` new tokens (``min_new_tokens`` forces the full length, so
both variants generate the same number of tokens). The variants alternate, one call each per repetition, after
one warm-up call each; the same stream seeds every time, and the samples of both variants are compared (they
must be identical). On a CPU the two agents share one device, so ``auto`` would not overlap them: "on" forces
one thread per model, which is what distinct devices get under ``auto``.

Printed per model: the median ms per level of each variant, the ratio off/on (> 1: overlap is faster), whether
the samples were identical, and the load average before and after; then the torch intra-op threads seen inside
a worker and the *ceiling*: two loops of plain single-threaded matmuls (64x512 @ 512x1536, the 30m model's MLP
shape) one after another against in two threads, i.e. what two threads can gain on this machine at that moment.

``--fit``: per model, a 2-turn MAGRPO fit (2 full-model agents, ``--fit-items`` items one per step, K=
``--candidates``, ``--tokens`` new tokens, ``rollout_buffer_size`` 1 so both agents drain after every node of the
tree, ``train_batch_size`` 1) with ``agent_overlap`` off and on, alternating, ``--fit-reps`` times each; with
``--fit-job madpo`` instead a MADPO fit (``--candidates`` joint candidates per item, 2 pairs per item, batches of
4 pairs). Printed: the median seconds of the whole fit, of its generation (``sample_many``) and of its updates
(MAGRPO's ``drain_agents``, MADPO's ``training_step``), the ratios off/on, and whether the two variants ended
with identical weights (they must).
With ``--threads 1`` each agent's generation is single-threaded, so with >= 2 idle cores the ideal ratio is 2x;
the other jobs of a shared machine take cores away from it (the ceiling shows how many), and the Python part of
HF's decoding loop holds the GIL, so a tiny model whose step is mostly Python gains less than a larger one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import transformers

from comlrl_lightning.agents import build_agents
from comlrl_lightning.engines import HFEngine, SampleRequest
from comlrl_lightning.generation import SamplingSettings, SamplingStream
from comlrl_lightning.tiny import build_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine import build_model  # noqa: E402  (the same 30m model)

TOPICS = ("rivers", "bread", "trains", "music", "maps", "clouds", "glass", "birds")


def level(engine: HFEngine, prompts: list[str], args: argparse.Namespace) -> tuple[float, list]:
    settings = SamplingSettings(max_new_tokens=args.tokens, temperature=1.0, top_p=1.0, top_k=None,
                                extra={"min_new_tokens": args.tokens})
    requests = [SampleRequest(a, prompts, args.candidates, SamplingStream(100 + a)) for a in range(2)]
    t0 = time.perf_counter()
    out = engine.sample_many(requests, settings)
    return time.perf_counter() - t0, out


def worker_threads() -> int:
    """torch's intra-op threads as a freshly started thread sees them (what a pool worker runs with)."""
    seen = []
    t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    t.start()
    t.join()
    return seen[0]


def bench(model_dir: str, args: argparse.Namespace) -> dict:
    team = build_agents(model_dir, num_agents=2)
    engines = {"off": HFEngine(team, overlap="off"), "on": HFEngine(team, overlap="on")}
    prompts = [f"Topic: {TOPICS[i % len(TOPICS)]}. Write one line." for i in range(args.prompts)]
    times: dict[str, list[float]] = {"off": [], "on": []}
    outs: dict[str, list] = {}
    load_before = os.getloadavg()[0]
    for rep in range(1 + args.reps):
        for name, engine in engines.items():
            seconds, out = level(engine, prompts, args)
            if rep:  # the first repetition warms up
                times[name].append(seconds)
            outs.setdefault(name, out)
            if out != outs[name]:
                raise AssertionError(f"{name}: the same seeds gave different samples")
    return {"off": statistics.median(times["off"]), "on": statistics.median(times["on"]),
            "identical": outs["off"] == outs["on"], "load": (load_before, os.getloadavg()[0])}


def fit_once(model_dir: str, mode: str, args: argparse.Namespace) -> dict:
    """One ``--fit-job`` fit with ``agent_overlap=mode``: seconds in total, in generation and in updates (MAGRPO's
    ``drain_agents``; MADPO's ``training_step``: its forwards, backward and steps); final weights."""
    from comlrl_lightning.config import MADPOConfig, MAGRPOConfig
    from comlrl_lightning.engines import engine_of
    from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
    from comlrl_lightning.multiturn.transitions import plain_transition
    from comlrl_lightning.trainers.preference import MADPOTrainer
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    items = [{"prompt": f"Topic: {TOPICS[i % len(TOPICS)]}."} for i in range(args.fit_items)]
    common = dict(max_new_tokens=args.tokens, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-4,
                  num_train_epochs=1, eval_interval=0, eval_num_samples=1, agent_overlap=mode)
    quiet = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                 enable_model_summary=False)
    if args.fit_job == "madpo":
        config = MADPOConfig(preference_num_candidates=args.candidates, preference_pairs_per_sample=2,
                             train_batch_size=4, **common)
        trainer = MADPOTrainer(agent_model=model_dir, train_dataset=items, reward_func=cooperative_reward,
                               formatters=FORMATTERS, args=config, trainer_kwargs=quiet)
        update = "training_step"
    else:
        config = MAGRPOConfig(num_turns=2, num_generations=args.candidates, rollout_buffer_size=1, train_batch_size=1,
                              **common)
        trainer = MAGRPOTrainer(agent_model=model_dir, train_dataset=items, reward_func=cooperative_reward,
                                formatters=FORMATTERS, external_transition=plain_transition, args=config,
                                trainer_kwargs=quiet)
        update = "drain_agents"
    module, engine = trainer.module, engine_of(trainer.team)
    spent = {"generation": 0.0, "updates": 0.0}

    def timed(key, fn):
        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[key] += time.perf_counter() - t0
        return run

    engine.sample_many = timed("generation", engine.sample_many)
    setattr(module, update, timed("updates", getattr(module, update)))
    t0 = time.perf_counter()
    trainer.train()
    spent["total"] = time.perf_counter() - t0
    spent["weights"] = [p.detach().clone() for i in range(2) for p in trainer.team.parameters_of(i)]
    spent["steps"] = trainer.trainer.global_step
    return spent


def bench_fit(model_dir: str, args: argparse.Namespace) -> dict:
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    load_before = os.getloadavg()[0]
    for _ in range(args.fit_reps):
        for mode in runs:
            runs[mode].append(fit_once(model_dir, mode, args))
    first = {mode: r[0]["weights"] for mode, r in runs.items()}
    identical = all(torch.equal(a, b) for a, b in zip(first["off"], first["on"]))
    out = {mode: {k: statistics.median(r[k] for r in rs) for k in ("total", "generation", "updates")}
           for mode, rs in runs.items()}
    return {**out, "identical": identical, "steps": runs["on"][0]["steps"], "load": (load_before, os.getloadavg()[0])}


def ceiling(reps: int = 3, loops: int = 400) -> float:
    """Median ratio (sequential / two threads) of two loops of single-threaded matmuls."""
    x, w = torch.randn(64, 512), torch.randn(512, 1536)

    def work() -> None:
        for _ in range(loops):
            x @ w

    ratios = []
    for _ in range(reps):
        t0 = time.perf_counter()
        work()
        work()
        t1 = time.perf_counter()
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ratios.append((t1 - t0) / (time.perf_counter() - t1))
    return statistics.median(ratios)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repetitions, tiny model only")
    parser.add_argument("--models", default=None, help="comma-separated: tiny, 30m (default both; --quick: tiny)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions per variant (default 7)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per agent (nodes of the level)")
    parser.add_argument("--candidates", type=int, default=4, help="samples per prompt (K)")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per sample")
    parser.add_argument("--fit", action="store_true", help="also a 2-turn MAGRPO fit per model, overlap off and on")
    parser.add_argument("--fit-job", choices=("magrpo2", "madpo"), default="magrpo2",
                        help="the --fit job: 2-turn MAGRPO (default) or MADPO")
    parser.add_argument("--fit-items", type=int, default=2, help="items of the --fit run (one per step)")
    parser.add_argument("--fit-reps", type=int, default=3, help="fits per variant with --fit")
    args = parser.parse_args(argv)
    args.reps = args.reps if args.reps is not None else (3 if args.quick else 7)
    models = (args.models or ("tiny" if args.quick else "tiny,30m")).split(",")
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    t_start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="overlap_bench_") as tmp:
        for name in models:
            folder = Path(tmp) / name
            model_dir = build_tiny_model(folder / "tiny") if name == "tiny" else build_model(name, folder)
            rows.append((name, bench(model_dir, args), bench_fit(model_dir, args) if args.fit else None))
    print(f"\nOne level, 2 agents x {args.prompts} prompts x K={args.candidates} x {args.tokens} tokens, torch "
          f"{torch.__version__}, threads={torch.get_num_threads()} (in a worker: {worker_threads()}), "
          f"{os.cpu_count()} CPUs, {args.reps} reps")
    print(f"{'model':<7}{'off ms':>9}{'on ms':>9}{'off/on':>8}  identical  load before/after")
    for name, r, _ in rows:
        print(f"{name:<7}{1e3 * r['off']:>9.1f}{1e3 * r['on']:>9.1f}{r['off'] / r['on']:>7.2f}x  "
              f"{str(r['identical']):<9}  {r['load'][0]:.2f} / {r['load'][1]:.2f}")
    if args.fit:
        job = "2-turn MAGRPO" if args.fit_job == "magrpo2" else "MADPO (2 pairs per item, batches of 4 pairs)"
        print(f"\n{job} fit, {args.fit_items} items, K={args.candidates}, {args.tokens} tokens, median of "
              f"{args.fit_reps} fits per variant (seconds; off/on > 1: overlap is faster)")
        print(f"{'model':<7}{'part':<12}{'off s':>8}{'on s':>8}{'off/on':>8}  identical  steps  load before/after")
        for name, _, f in rows:
            for part in ("total", "generation", "updates"):
                print(f"{name:<7}{part:<12}{f['off'][part]:>8.2f}{f['on'][part]:>8.2f}"
                      f"{f['off'][part] / f['on'][part]:>7.2f}x  {str(f['identical']):<9}  {f['steps']:>5}  "
                      f"{f['load'][0]:.2f} / {f['load'][1]:.2f}")
    print(f"ceiling (plain matmuls, sequential/2 threads): {ceiling():.2f}x, load {os.getloadavg()[0]:.2f}")
    print(f"total {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
