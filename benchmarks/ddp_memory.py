"""Per-rank bytes of parameters plus optimizer state for 2 full agents on 2 CPU processes (gloo), under
``strategy="ddp"`` (every rank a whole replica of both agents) and under FSDP2 (``ModelParallelStrategy()``: the
module's ``configure_model`` shards each agent layer by layer over the 2 ranks, docs/scaling.md "FSDP2"), and the
cost of gathering the sharded agents for generation.

Run ``python benchmarks/ddp_memory.py [--model tiny|8m|30m]``. Each variant is a real library fit: a 1-turn MAGRPO
team of 2 agents (random Qwen2 models of ``comlrl_lightning.tiny``'s shapes; tiny: 2 layers, hidden 64, 0.16 M
parameters; 8m: 8 layers, hidden 256; 30m: 10 layers, hidden 512), 4 prompts, 2 per rank, default AdamW (fused),
one epoch. After the fit each rank counts the bytes of the tensors it holds: the agents' parameters (FSDP2: the
local shards of the DTensors) and every optimizer's state (``exp_avg``, ``exp_avg_sq``, ``step``). Gradients are
not counted (freed the same way by both). Printed per rank: parameter MiB, optimizer MiB, their sum, the ratio
FSDP2 / DDP (issue 29 asks <= 0.55), then the generation cost under FSDP2: the time of the all-gathers that unshard
an agent before each ``generate`` call (:func:`comlrl_lightning.sharding.gathered`) against the time of the calls,
and the same fit's generation time under DDP.

Lightning's launcher re-runs this script once per rank; rank 0 prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time

import torch

SHAPES = {"tiny": {}, "8m": dict(hidden_size=256, num_layers=8, intermediate_size=1024),
          "30m": dict(hidden_size=512, num_layers=10, intermediate_size=1536, num_heads=8, num_kv_heads=4)}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _bytes(tensors) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


def _fit(model_dir: str, root: str, strategy, timing: dict) -> dict:
    from comlrl_lightning.config import MAGRPOConfig
    from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]
    args = MAGRPOConfig(num_turns=1, num_generations=2, max_new_tokens=16, temperature=1.0, top_p=1.0, top_k=None,
                        train_batch_size=2, rollout_buffer_size=2, num_train_epochs=1, eval_interval=0,
                        eval_num_samples=0, seed=0)
    tk = dict(accelerator="cpu", devices=2, strategy=strategy, enable_progress_bar=False, enable_model_summary=False,
              enable_checkpointing=False, logger=False, default_root_dir=root)
    tr = MAGRPOTrainer(agent_model=model_dir, train_dataset=items, reward_func=cooperative_reward,
                       formatters=FORMATTERS, args=args, trainer_kwargs=tk)
    tr.train()
    params = [p for i in range(2) for p in tr.team.parameters_of(i)]
    opts = [getattr(o, "_optimizer", o) for o in tr.trainer.optimizers]
    state = [v for o in opts for s in o.state.values() for v in s.values() if torch.is_tensor(v)]
    return {"params": _bytes(params), "optimizer": _bytes(state),
            **{k: timing.get(k, 0.0) for k in ("gather_s", "generate_s", "calls")}, "rank": tr.trainer.global_rank}


def _timed_gathered(timing: dict):
    """Time the unshard (``gathered``'s entry) and the whole generate call of each sharded agent."""
    import comlrl_lightning.sharding as sharding

    original = sharding.gathered

    @contextlib.contextmanager
    def gathered(module):
        t0 = time.perf_counter()
        with original(module) as m:
            timing["gather_s"] = timing.get("gather_s", 0.0) + time.perf_counter() - t0
            timing["calls"] = timing.get("calls", 0) + 1
            yield m
        timing["generate_s"] = timing.get("generate_s", 0.0) + time.perf_counter() - t0

    sharding.gathered = gathered


def _timed_generate(timing: dict):
    """Under DDP: time every ``model.generate`` call of the team (the plain models' generation)."""
    import transformers

    original = transformers.GenerationMixin.generate

    def generate(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return original(self, *a, **k)
        finally:
            timing["generate_s"] = timing.get("generate_s", 0.0) + time.perf_counter() - t0
            timing["calls"] = timing.get("calls", 0) + 1

    transformers.GenerationMixin.generate = generate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="8m", choices=sorted(SHAPES))
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    from lightning.pytorch.strategies import ModelParallelStrategy

    from comlrl_lightning.tiny import build_tiny_model

    root = os.environ.setdefault("COMLRL_MEMORY_BENCH_ROOT", tempfile.mkdtemp(prefix="comlrl_ddp_memory_"))
    model_dir = os.path.join(root, a.model)
    if not os.path.isdir(model_dir):
        build_tiny_model(model_dir, **SHAPES[a.model])
    ddp_timing: dict = {}
    _timed_generate(ddp_timing)
    ddp = _fit(model_dir, root, "ddp", ddp_timing)
    fsdp_timing: dict = {}
    _timed_gathered(fsdp_timing)
    fsdp = _fit(model_dir, root, ModelParallelStrategy(), fsdp_timing)
    rank = ddp["rank"]
    with open(os.path.join(root, f"rank{rank}.json"), "w") as f:
        json.dump({"ddp": ddp, "fsdp2": fsdp}, f)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
    if rank != 0:
        return
    results = [json.load(open(os.path.join(root, f"rank{r}.json"))) for r in (0, 1)]
    mib = 1024 ** 2
    print(f"model {a.model}: 2 full agents, MAGRPO, AdamW (fused), float32, 2 ranks (gloo); MiB per rank")
    print(f"{'rank':>4} {'strategy':>24} {'params':>9} {'optimizer':>10} {'total':>9} {'vs DDP':>7}")
    for r, res in enumerate(results):
        d, s = res["ddp"], res["fsdp2"]
        dt, st = d["params"] + d["optimizer"], s["params"] + s["optimizer"]
        print(f"{r:>4} {'ddp':>24} {d['params'] / mib:9.2f} {d['optimizer'] / mib:10.2f} {dt / mib:9.2f} {1:7.2f}")
        print(f"{r:>4} {'ModelParallelStrategy':>24} {s['params'] / mib:9.2f} {s['optimizer'] / mib:10.2f} "
              f"{st / mib:9.2f} {st / dt:7.3f}")
    print("generation (rank 0): FSDP2 gathers each agent whole before each generate call")
    d, s = results[0]["ddp"], results[0]["fsdp2"]
    calls = max(1, s["calls"])
    print(f"  FSDP2: {s['calls']} generate calls, {s['generate_s']:.3f} s in all, of which unshard (all-gathers) "
          f"{s['gather_s']:.3f} s ({1000 * s['gather_s'] / calls:.1f} ms per call, "
          f"{s['gather_s'] / max(s['generate_s'], 1e-9):.0%})")
    print(f"  DDP:   {d['calls']} generate calls, {d['generate_s']:.3f} s in all (the first fit's first calls also "
          "warm up torch and transformers)")


if __name__ == "__main__":
    main()
