"""Weight-sync verification on a real engine (docs/engines.md, "Verification"): the log-prob gap of a healthy run and
of a deliberately stale engine, per layout. Prints the gaps of every update of agent 0.

    .venv-vllm/bin/python benchmarks/sync_gap.py            # vLLM, LoRA and full layouts
    .venv/bin/python benchmarks/sync_gap.py --backend hf     # the HF engine

The stale engine is the engine told about every update (its versions agree) whose weight pushes are skipped after
the first: only the log-prob gap can tell. ``logprob_gap_threshold`` is off here so that every gap is printed.
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")


def run(model_dir: str, backend: str, lora: bool, stale: bool, lr: float) -> list[float]:
    import torch

    from comlrl_lightning.config import MAGRPOConfig
    from comlrl_lightning.data.sources import load_task_items
    from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    torch.set_num_threads(1)
    kw = {"generation_backend": "vllm", "vllm_kwargs": {"kv_cache_memory_bytes": 64 * 2**20}} if backend == "vllm" \
        else {}
    args = MAGRPOConfig(num_train_epochs=1, num_generations=4, max_new_tokens=16, temperature=1.0, top_p=1.0,
                        top_k=None, agent_learning_rate=lr, eval_interval=0, eval_num_samples=1, logging_steps=1,
                        rollout_buffer_size=2, logprob_gap_threshold=None, **kw)
    tr = MAGRPOTrainer(agent_model=model_dir, train_dataset=load_task_items("builtin:cooperative")[:12],
                       eval_dataset=None, reward_func=cooperative_reward, formatters=FORMATTERS, args=args,
                       lora={"r": 8, "lora_alpha": 16} if lora else None,
                       trainer_kwargs=dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                                           enable_progress_bar=False, enable_model_summary=False))
    module, engine = tr.module, tr.module.team.engine
    if stale:
        if backend == "vllm":
            pushed = {"done": False}
            original = engine._push

            def push_once(agents):
                if not pushed["done"]:
                    original(agents)
                    pushed["done"] = True

            engine._push = push_once
            engine.weight_version = lambda agent: engine.applied[agent]  # versions agree: only the gap can tell
        else:
            from comlrl_lightning.agents import build_agents
            from comlrl_lightning.engines.hf import HFEngine

            frozen = build_agents(model_dir, num_agents=2, lora={"r": 8, "lora_alpha": 16} if lora else None)
            module.team.engine = HFEngine(frozen)  # the initial agents, never updated
    gaps: list[float] = []
    original_log = module._log_group

    def spy(agent, turn, group, losses, staleness=0.0):
        if agent == 0 and agent in module._logprob_gaps:
            gaps.append(module._logprob_gaps[agent])
        return original_log(agent, turn, group, losses, staleness)

    module._log_group = spy
    tr.train()
    return gaps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["vllm", "hf"], default="vllm")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--layouts", nargs="+", choices=["lora", "full"], default=["lora", "full"])
    a = p.parse_args()
    from comlrl_lightning.tiny import build_tiny_model

    # hidden 128 with 4 heads: a head size vLLM's CPU attention serves
    model_dir = build_tiny_model(os.path.join(tempfile.mkdtemp(), "model"), hidden_size=128, num_heads=4,
                                 num_kv_heads=2)
    for layout in a.layouts:
        for stale in (False, True):
            gaps = run(model_dir, a.backend, layout == "lora", stale, a.lr)
            label = "stale " if stale else "healthy"
            print(f"{a.backend} {layout:4s} {label} lr {a.lr:g}: gap per update of agent 0: "
                  + " ".join(f"{g:.4f}" for g in gaps), flush=True)


if __name__ == "__main__":
    main()
