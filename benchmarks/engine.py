"""Rollout generation with the HF engine against the vLLM engine (docs/engines.md), measured in the same run.

Run in an environment with vLLM (``tools/install_vllm_env.sh``)::

    .venv-vllm/bin/python benchmarks/engine.py [--quick] [--models tiny,30m] [--threads N] [--fit]
    .venv-vllm/bin/python benchmarks/engine.py --model-dir ~/.cache/comlrl_lightning/gguf/<digest>   # a real model

Models (random weights, the embedded tokenizer, float32, built in a temporary folder):

  tiny  the embedded recipe with a head size vLLM's CPU attention serves: Qwen2, 2 layers, hidden 128, 4 heads
        / 2 KV heads (head size 32), 0.4 M parameters;
  30m   Qwen2, 10 layers, hidden 512, 8 heads / 4 KV heads (head size 64), intermediate 1536, tied embeddings:
        31.8 M parameters.

``--model-dir PATH`` measures a Hugging Face folder instead (e.g. SmolLM2-135M-Instruct de-quantised by
``comlrl_lightning.gguf`` into its cache: docs/models.md; the vLLM environment needs no ``gguf`` package to read
that folder). Its prompts then go through the tokenizer's chat template when it has one.

Team: 2 LoRA agents (r = 8) on one base, as ``lora={"r": 8}`` builds them (``--layout full``: one full-model
agent instead). Workload per repetition (one tree
level of a MAGRPO batch, or a MADPO collection chunk): ``--prompts`` task prompts per agent, ``--candidates``
samples each, ``--tokens`` new tokens (``min_new_tokens`` forces the full length so both engines generate the
same number of tokens). ``HFEngine.sample_many`` (one ``generate`` per agent) and ``VLLMEngine.sample_many`` (one
mixed-adapter call for both agents) are timed alternately; the vLLM engine's start and the first call of each
engine are warm-ups, not timed. Printed per model: median seconds per repetition, generated tokens/s, and the
ratio vllm/hf of tokens/s.

``--fit`` also times a short 2-turn MAGRPO fit (``MAGRPOTrainer``, 2 LoRA agents, 4 generations, 6 items) with
each backend, reporting the wall time of the fit with and without the vLLM engine's start.

HF runs with ``--threads`` torch threads (default 1, the steadier setting on 2 cores); vLLM's worker picks its
own (one OMP thread on 2 cores unless ``VLLM_CPU_OMP_THREADS_BIND`` says otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

SIZES = {
    "tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 256},
    "30m": {"hidden_size": 512, "num_hidden_layers": 10, "num_attention_heads": 8, "num_key_value_heads": 4,
            "intermediate_size": 1536},
}


def build_model(name: str, folder: Path) -> str:
    """The embedded tiny model's recipe (tokenizer, vocab 512) at the sizes of ``SIZES[name]``, random weights."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, Qwen2ForCausalLM

    from comlrl_lightning.tiny import build_tiny_model

    tiny = build_tiny_model(folder / "tiny")
    config = AutoConfig.from_pretrained(tiny)
    for k, v in SIZES[name].items():
        setattr(config, k, v)
    config.head_dim = config.hidden_size // config.num_attention_heads
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    out = folder / name
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(out)
    print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters", flush=True)
    return str(out)


def bench_generation(model_dir: str, args: argparse.Namespace) -> dict:
    from comlrl_lightning.agents import build_agents
    from comlrl_lightning.data.sources import chat_prompt
    from comlrl_lightning.engines import HFEngine, SampleRequest
    from comlrl_lightning.engines.vllm import VLLMEngine
    from comlrl_lightning.generation import SamplingSettings, SamplingStream

    if args.layout == "lora":
        team = build_agents(model_dir, num_agents=2, lora={"r": 8, "lora_alpha": 16, "init_lora_weights": False})
    else:  # one full-model agent: one engine
        team = build_agents(model_dir, num_agents=1)
    agents = range(team.num_agents)
    topics = ["rivers", "bread", "trains", "music", "maps", "clouds", "glass", "birds", "salt", "paper"]
    prompts = [f"Topic: {topics[i % len(topics)]} {i}." for i in range(args.prompts)]
    if args.model_dir:  # a real instruct model: prompts as its chat template writes them
        prompts = [chat_prompt(team.tokenizers[0], f"Write one sentence about {p}") for p in prompts]
    settings = SamplingSettings(max_new_tokens=args.tokens, temperature=1.0, top_p=1.0, top_k=None,
                                extra={"min_new_tokens": args.tokens})
    vllm_kwargs = {"kv_cache_memory_bytes": 512 * 2**20, **args.vllm_kwargs}
    engines = {"hf": HFEngine(team), "vllm": VLLMEngine(team, vllm_kwargs)}
    t = time.perf_counter()
    engines["vllm"].start()
    start_s = time.perf_counter() - t
    ops = engines["vllm"].servers[0].llm.collective_rpc("comlrl_lora_ops")[0]
    times: dict[str, list[float]] = {"hf": [], "vllm": []}
    tokens: dict[str, int] = {}
    try:
        for rep in range(args.reps + 1):
            for name, engine in engines.items():
                requests = [SampleRequest(a, prompts, args.candidates, SamplingStream(1000 * rep + a)) for a in agents]
                t = time.perf_counter()
                out = engine.sample_many(requests, settings)
                dt = time.perf_counter() - t
                tokens[name] = sum(len(c) for s in out for row in s.completion_ids for c in row)
                if rep > 0:
                    times[name].append(dt)
    finally:
        engines["vllm"].close()
    result = {"start_s": start_s, "ops": ops}
    for name in engines:
        med = statistics.median(times[name])
        result[name] = (med, tokens[name] / med, tokens[name])
    return result


def bench_fit(model_dir: str, args: argparse.Namespace) -> dict:
    from comlrl_lightning.config import MAGRPOConfig
    from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
    from comlrl_lightning.multiturn.transitions import plain_transition
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music", "maps", "clouds")]
    out = {}
    for backend in ("hf", "vllm"):
        cfg = MAGRPOConfig(num_turns=2, num_generations=4, max_new_tokens=args.tokens, temperature=1.0, top_p=1.0,
                           top_k=None, num_train_epochs=1, eval_interval=0, eval_num_samples=1, logging_steps=1,
                           rollout_buffer_size=2, generation_backend=backend,
                           vllm_kwargs={"kv_cache_memory_bytes": 512 * 2**20})
        trainer = MAGRPOTrainer(agent_model=model_dir, train_dataset=items, reward_func=cooperative_reward,
                                formatters=FORMATTERS, external_transition=plain_transition, args=cfg,
                                lora={"r": 8, "lora_alpha": 16},
                                trainer_kwargs=dict(accelerator="cpu", devices=1, logger=False,
                                                    enable_checkpointing=False, enable_progress_bar=False,
                                                    enable_model_summary=False))
        engine = trainer.module.team.engine
        start_s = 0.0
        if backend == "vllm":
            t = time.perf_counter()
            engine.start()
            start_s = time.perf_counter() - t
        t = time.perf_counter()
        trainer.train()
        out[backend] = (time.perf_counter() - t, start_s)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--models", default="tiny,30m", help="comma-separated: tiny, 30m")
    parser.add_argument("--model-dir", default=None, help="measure this Hugging Face model folder instead")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per agent (default 32)")
    parser.add_argument("--candidates", type=int, default=4, help="samples per prompt (default 4)")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per sample (default 32)")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for HF (default 1)")
    parser.add_argument("--quick", action="store_true", help="3 repetitions, 16 prompts")
    parser.add_argument("--fit", action="store_true", help="also time a 2-turn MAGRPO fit per backend")
    parser.add_argument("--lora-ops", choices=("grouped", "vllm"), default="grouped",
                        help="vLLM's CPU LoRA ops: ours, grouped by adapter (default), or vLLM's own")
    parser.add_argument("--vllm-kwargs", type=json.loads, default={},
                        help='JSON of extra vllm.LLM arguments, e.g. \'{"enforce_eager": false}\'')
    parser.add_argument("--layout", choices=("lora", "full"), default="lora",
                        help="2 LoRA agents on one base (default) or 1 full-model agent")
    args = parser.parse_args()
    os.environ["COMLRL_VLLM_LORA_OPS"] = args.lora_ops
    if args.quick:
        args.reps, args.prompts = 3, 16
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        models = [Path(args.model_dir).name] if args.model_dir else args.models.split(",")
        for name in models:
            model_dir = args.model_dir or build_model(name, Path(tmp))
            r = bench_generation(model_dir, args)
            team = "2 LoRA agents" if args.layout == "lora" else "1 full-model agent"
            print(f"[{name}] {team} x {args.prompts} prompts x {args.candidates} samples x {args.tokens} "
                  f"tokens; vLLM engine start {r['start_s']:.1f} s (not timed below)"
                  + (f", {r['ops']} LoRA ops" if args.layout == "lora" else ""))
            for backend in ("hf", "vllm"):
                med, rate, n = r[backend]
                print(f"[{name}] {backend:>4}: {med:7.3f} s per level ({n} tokens), {rate:8.1f} tokens/s")
            print(f"[{name}] ratio vllm/hf tokens/s: {r['vllm'][1] / r['hf'][1]:.2f}x", flush=True)
            if args.fit:
                f = bench_fit(model_dir, args)
                print(f"[{name}] 2-turn MAGRPO fit: hf {f['hf'][0]:.1f} s, vllm {f['vllm'][0]:.1f} s "
                      f"(+{f['vllm'][1]:.1f} s engine start); ratio hf/vllm wall: {f['hf'][0] / f['vllm'][0]:.2f}x",
                      flush=True)


if __name__ == "__main__":
    main()
