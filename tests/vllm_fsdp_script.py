"""A MAGRPO fit with ``generation_backend="vllm"`` under FSDP2 (Lightning's ModelParallelStrategy) on 2 CPU processes
(gloo), run by tests/engines/test_vllm_fsdp.py in the vLLM environment.

Usage: ``vllm_fsdp_script.py OUT MODEL LAYOUT``, LAYOUT ``full`` (one full agent: one engine per rank) or ``lora``
(2 LoRA agents on one base: one engine per rank serving both adapters). After the first optimizer step (the engine
was told the agent changed), a callback on every rank samples the prompts greedily from the engine (its push gathers
the sharded weights first), gathers the whole weights itself, loads them into a fresh HF copy of the agents and
samples the same prompts from it (and from the initial agents). Each rank writes ``OUT/rank{r}.pt``: the three token
lists and log-prob lists, the
engine's gathers before and after the check (seconds, bytes), whether the gathered weights differ from the initial
ones, the type name of an agent parameter, the global step, and the resident memory of this rank's process tree.
"""
import os
import sys
import time

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

PROMPTS = ["Topic: rivers.", "Topic: bread and cheese.", "Write a short answer about trains."]


def length_reward(completions1: list[str]) -> list[float]:
    """One agent's reward: its completion's length and distinct characters (varies between candidates)."""
    return [len(c.strip()) / 10 + len(set(c)) / 5 for c in completions1]


def memory_mib() -> float:
    import psutil

    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)]) / 2**20


class Check(L.Callback):
    def __init__(self, model_dir: str, lora: dict | None, record: dict):
        self.model_dir, self.lora, self.record = model_dir, lora, record

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.record:
            return
        from comlrl_lightning.agents import build_agents
        from comlrl_lightning.engines import HFEngine, SampleRequest
        from comlrl_lightning.generation import SamplingSettings, SamplingStream
        from comlrl_lightning.sharding import gathered_state_dict

        team, engine = pl_module.team, pl_module.team.engine
        n = team.num_agents
        greedy = SamplingSettings(max_new_tokens=10, temperature=1.0, top_p=1.0, top_k=1)
        before, stale = list(engine.gathers), sorted(engine.stale)
        start = time.perf_counter()
        engine._push(list(range(n)))  # gather, write, reload (what the next generation would do first), timed
        push_seconds = time.perf_counter() - start
        got = engine.sample_many([SampleRequest(a, PROMPTS, 1, SamplingStream(a)) for a in range(n)], greedy)
        states = [gathered_state_dict(m) for m in team.unique_models()]  # what the push should have gathered
        copy = build_agents(self.model_dir, num_agents=n, lora=self.lora)
        initial = [m.state_dict() for m in copy.unique_models()]
        changed = any(not torch.equal(state[k], init[k]) for state, init in zip(states, initial) for k in init)
        initial_out = [HFEngine(copy).sample(a, PROMPTS, 1, greedy, SamplingStream(a)) for a in range(n)]
        for m, state in zip(copy.unique_models(), states):
            m.load_state_dict(state)
        want = [HFEngine(copy).sample(a, PROMPTS, 1, greedy, SamplingStream(a)) for a in range(n)]
        self.record.update(
            engine_tokens=[s.completion_ids for s in got], hf_tokens=[s.completion_ids for s in want],
            engine_logprobs=[s.logprobs for s in got], hf_logprobs=[s.logprobs for s in want],
            initial_tokens=[s.completion_ids for s in initial_out], initial_logprobs=[s.logprobs for s in initial_out],
            stale=stale, gathers_before=before, gathers_after=list(engine.gathers), changed=changed,
            param_type=type(next(team.models[0].parameters())).__name__, memory_mib=memory_mib(),
            served_version=[s.version for s in got], requested=list(engine.requested), push_seconds=push_seconds)


def main() -> None:
    from comlrl_lightning.config import MAGRPOConfig
    from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    out_dir, model_dir, layout = sys.argv[1], sys.argv[2], sys.argv[3]
    lora = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]} if layout == "lora" else None
    n = 2 if layout == "lora" else 1
    items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]
    args = MAGRPOConfig(num_agents=n, num_train_epochs=1, num_generations=2, max_new_tokens=6, temperature=1.0,
                        top_p=1.0, top_k=None, agent_learning_rate=3e-2, eval_interval=0, eval_num_samples=0,
                        rollout_buffer_size=1, train_batch_size=1, seed=0, generation_backend="vllm",
                        vllm_kwargs={"kv_cache_memory_bytes": 32 * 2**20})
    record: dict = {}
    tk = dict(accelerator="cpu", devices=2, strategy=ModelParallelStrategy(), enable_progress_bar=False,
              enable_model_summary=False, enable_checkpointing=False, default_root_dir=out_dir, logger=False,
              callbacks=[Check(model_dir, lora, record)])
    tr = MAGRPOTrainer(agent_model=model_dir, train_dataset=items, reward_func=cooperative_reward if n == 2 else
                       length_reward, formatters=FORMATTERS[:n], args=args, lora=lora, trainer_kwargs=tk)
    tr.train()
    record.update(global_step=tr.trainer.global_step, world=tr.trainer.world_size, gathers=list(tr.team.engine.gathers),
                  started=tr.team.engine.started)
    torch.save(record, os.path.join(out_dir, f"rank{tr.trainer.global_rank}.pt"))


if __name__ == "__main__":
    main()
