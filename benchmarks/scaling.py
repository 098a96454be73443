"""Collection and rollouts split across processes: 2 processes x 1 thread against 1 process x 1 thread.

Run ``python benchmarks/scaling.py [--quick] [--what collection|rollouts|both] [--items N] [--candidates N]
[--model tiny|large] [--reps N]``.
The same global work, the offline collection of MADPO (``collect_offline_split``, the function
``PreferenceCollection`` calls: sample ``--candidates`` joint responses per item from 2 agents, score them with
the built-in cooperative reward, select pairs, gather the pairs of every rank), runs with world size 1 and with
world size 2 (a gloo process group on 127.0.0.1, one torch thread per process, the ranks started by
``torch.multiprocessing``). Each process loads the model once; the timed part is the collection itself, from a
barrier before it to a barrier after the gather (what a round costs in a real run). Repetitions alternate
between the world sizes, so a slow phase of the machine hits both. ``rollouts`` times 2-turn MAGRPO instead
(``MAGRPOModule.rollout_batch``: G = ``--candidates`` completions per node, 1 + G nodes per tree, the plain
transition), each rank rolling out its block of the prompts, 4 prompts per step, as DDP training would.

Printed: the median wall seconds per collection of each world size, items/s, the CPU seconds of the busiest
rank, and the speed-ups (1-process / 2-process) of the wall time and of the busiest rank's CPU time, measured
in this run. On a machine with fewer free cores than processes the wall speed-up cannot reach 2 (check that
nothing else runs); the CPU-time ratio is what the wall speed-up becomes on free cores.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))

TOPICS = ("rivers", "bread", "trains", "music", "maps", "clouds", "glass", "birds", "salt", "paper", "bells", "ice")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collect_times(rank: int, world_size: int, port: int, model_dir: str, opts: dict,
                   out: str | None) -> list[tuple[float, float]]:
    """Run ``opts['reps']`` collections on this rank; returns per collection the wall seconds (barrier to barrier)
    and the largest CPU seconds any rank spent in it (its own work, load-independent)."""
    torch.set_num_threads(1)
    if world_size > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    from comlrl_lightning.agents import build_agents
    from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
    from comlrl_lightning.generation import SamplingSettings
    from comlrl_lightning.preferences import collect_offline_split
    from comlrl_lightning.rewards import RewardOracle

    n = opts["items"] if opts["what"] == "collection" else opts["rollout_items"]
    items = [{"prompt": f"Topic: {TOPICS[i % len(TOPICS)]} {i}."} for i in range(n)]
    oracle = RewardOracle(cooperative_reward)
    if opts["what"] == "collection":
        team = build_agents(model_dir, num_agents=2)
        settings = SamplingSettings(max_new_tokens=opts["new_tokens"], temperature=1.0, top_p=1.0, top_k=None)
    else:  # 2-turn MAGRPO rollouts of this rank's prompts, as the DistributedSampler would hand them out
        from comlrl_lightning.config.magrpo import MAGRPOConfig
        from comlrl_lightning.distributed import shard_bounds
        from comlrl_lightning.modules.magrpo import MAGRPOModule
        from comlrl_lightning.multiturn.transitions import plain_transition

        module = MAGRPOModule(agent_model=model_dir, args=MAGRPOConfig(
            num_turns=2, num_generations=opts["candidates"], max_new_tokens=opts["new_tokens"], temperature=1.0,
            top_p=1.0, top_k=None, seed=rank))
        start, end = shard_bounds(len(items), rank, world_size)
        entries = list(enumerate(items))[start:end]
    times = []
    for rep in range(opts["reps"] + 1):  # the first collection warms up and is not timed
        if world_size > 1:
            dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        if opts["what"] == "collection":
            collect_offline_split(team, items, FORMATTERS, oracle, settings, opts["candidates"], "reward_gap", 2,
                                  seed=rep, rank=rank, world_size=world_size, chunk_size=16, progress=False)
        else:
            for i in range(0, len(entries), 4):  # batches of 4 prompts per training step
                module.rollout_batch(entries[i:i + 4], FORMATTERS, oracle, plain_transition)
        cpu = time.process_time() - c0
        if world_size > 1:
            dist.barrier()
        wall = time.perf_counter() - t0
        if world_size > 1:
            every = [None] * world_size
            dist.all_gather_object(every, cpu)
            cpu = max(every)
        if rep:
            times.append((wall, cpu))
    if world_size > 1:
        dist.destroy_process_group()
    if out is not None and rank == 0:
        Path(out).write_text(" ".join(f"{w},{c}" for w, c in times))
    return times


def _worker(rank: int, world_size: int, port: int, model_dir: str, opts: dict, out: str) -> None:
    _collect_times(rank, world_size, port, model_dir, opts, out)


def run(world_size: int, model_dir: str, opts: dict, tmp: str) -> list[tuple[float, float]]:
    if world_size == 1:
        return _collect_times(0, 1, 0, model_dir, opts, None)
    out = os.path.join(tmp, f"times_{world_size}.txt")
    mp.spawn(_worker, args=(world_size, _free_port(), model_dir, opts, out), nprocs=world_size, join=True)
    return [tuple(float(v) for v in x.split(",")) for x in Path(out).read_text().split()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="2 repetitions per world size, 16 items")
    p.add_argument("--items", type=int, default=32, help="task items per collection (global work)")
    p.add_argument("--rollout-items", type=int, default=None, help="prompts per rollout pass (default: items / 4)")
    p.add_argument("--candidates", type=int, default=4, help="joint responses sampled per item")
    p.add_argument("--new-tokens", type=int, default=24, help="max_new_tokens of every completion")
    p.add_argument("--model", choices=("tiny", "large"), default="large",
                   help="tiny: the embedded model; large: the random 8-layer Qwen2 of madpo_step.py")
    p.add_argument("--reps", type=int, default=3, help="timed collections per world size (and round)")
    p.add_argument("--rounds", type=int, default=2, help="alternations of the two world sizes")
    p.add_argument("--what", choices=("collection", "rollouts", "both"), default="both",
                   help="MADPO's preference collection, 2-turn MAGRPO rollouts (4 prompts per step), or both")
    a = p.parse_args()
    if a.quick:
        a.reps, a.items, a.rounds = 2, 16, 1
    from comlrl_lightning.tiny import build_tiny_model

    torch.set_num_threads(1)
    rollout_items = a.rollout_items or max(2, a.items // 4)  # a 2-turn tree costs 1 + G generations per agent
    opts = {"items": a.items, "rollout_items": rollout_items, "candidates": a.candidates, "new_tokens": a.new_tokens,
            "reps": a.reps}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny")
        if a.model == "large":
            from madpo_step import build_large_model

            model_dir = build_large_model(model_dir, Path(tmp) / "large")
        for what in (("collection", "rollouts") if a.what == "both" else (a.what,)):
            opts["what"] = what
            times: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
            for _ in range(a.rounds):
                for w in (1, 2):
                    times[w] += run(w, model_dir, opts, tmp)
            label = ("preference collection" if what == "collection" else "2-turn MAGRPO rollouts (G = candidates)")
            n = a.items if what == "collection" else rollout_items
            print(f"{label}: {n} items x {a.candidates} candidates, 2 agents, {a.new_tokens} new tokens, "
                  f"model {a.model}, 1 thread per process")
            wall = {w: statistics.median(t for t, _ in r) for w, r in times.items()}
            cpu = {w: statistics.median(c for _, c in r) for w, r in times.items()}
            for w in (1, 2):
                print(f"  {w} process(es): median {wall[w]:.3f} s wall per pass ({n / wall[w]:.2f} items/s), busiest "
                      f"rank {cpu[w]:.3f} CPU-s; {len(times[w])} runs (wall): "
                      f"{' '.join(f'{t:.3f}' for t, _ in times[w])}")
            print(f"  speed-up 2 processes / 1 process: {wall[1] / wall[2]:.2f}x wall (target >= 1.7x); "
                  f"{cpu[1] / cpu[2]:.2f}x in the busiest rank's CPU time (the wall speed-up on free cores)")

if __name__ == "__main__":
    main()
