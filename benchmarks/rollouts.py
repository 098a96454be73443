"""Rollout cost of 2-turn MAGRPO: level-batched generation against the per-node loop.

Run ``python benchmarks/rollouts.py [--quick] [--threads N] [--models tiny,large,q05b] [--accelerator gpu]``.
For each model (the embedded tiny Qwen2; a larger random Qwen2 with the tiny tokenizer: 8 layers, hidden 256, as
in ``madpo_step.py``; ``q05b``: a random Qwen2 of Qwen2.5-0.5B's shape, 24 layers, hidden 896, 14 heads / 2 KV
heads, intermediate 4864, with the tiny tokenizer's 512-token vocabulary), it trains 2-turn MAGRPO (2 agents,
G = num_generations = 4, aligned joint actions, the plain transition, the built-in cooperative reward) through
``MAGRPOTrainer`` (a real Lightning fit, updates included) twice per repetition:

  batched   one ``generate`` per agent per tree level covering every node of the level (the default);
  per-node  the previous loop: one ``generate`` per agent per node (:func:`sample_per_node`, this benchmark's own).

A tree has 1 + 4 nodes, so a step makes 2 x 2 = 4 generate calls batched and 2 x 5 = 10 per node. Each fit
runs ``--steps`` training steps (one item each); the first step of every fit is a warm-up and not timed.
Fits alternate between the variants, so a slow phase of the machine hits both. Printed per variant: the
median wall ms per training step, steps/s, the median ms inside ``generate`` per step and its share of the
step, the generate calls per step, the generated token positions per second inside ``generate`` (rows x new
positions, padding after an early EOS included); then the ratios batched/per-node of steps/s and of generate time, both
measured in this run.

``--lora`` instead times one level's generation for two LoRA agents on one base: one call per agent against
one mixed-adapter call (peft ``adapter_names``), to decide whether the trainers should merge them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import transformers

from comlrl_lightning.config.magrpo import MAGRPOConfig
from comlrl_lightning.engines import engine_of
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.generation import Samples
from comlrl_lightning.modules.magrpo import MAGRPOModule
from comlrl_lightning.multiturn.transitions import plain_transition
from comlrl_lightning.tiny import build_tiny_model
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from madpo_step import build_large_model  # noqa: E402  (the same larger random Qwen2)

#: Qwen2.5-0.5B's shape (its vocabulary aside: the tiny tokenizer's 512 tokens).
Q05B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "intermediate_size": 4864}

TOPICS = ("rivers", "bread", "trains", "music", "maps", "clouds", "glass", "birds", "salt", "paper", "bells", "ice")


def sample_per_node(module: MAGRPOModule) -> None:
    """Make ``module`` sample as before level batching: one ``generate`` per agent per node of a tree level, where
    :class:`MAGRPOModule` makes one per agent per level. The draws come from the same streams in the same order."""

    def sample_level(agent, prompts):
        k, settings, stream = module.args.num_generations, module.sampling_settings(), module.streams[agent]
        parts = [engine_of(module.team).sample(agent, [p], k, settings, stream) for p, _ in prompts]
        s = Samples([x for p in parts for x in p.prompt_ids], [x for p in parts for x in p.completion_ids],
                    [x for p in parts for x in p.texts],
                    None if any(p.logprobs is None for p in parts) else [x for p in parts for x in p.logprobs],
                    parts[0].version if parts else None)
        return module._draws(agent, prompts, s)

    module._sample_level = sample_level
    module._sample_team_level = lambda prompts: [sample_level(a, level) for a, level in enumerate(prompts)]


class StepTimer(L.Callback):
    """Wall and CPU time of every training step, and the time and calls inside the agents' ``generate``."""

    def __init__(self, team):
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.gen: list[float] = []
        self.calls: list[int] = []
        self.tokens: list[int] = []
        self._gen_total = 0.0
        self._calls_total = 0
        self._tokens_total = 0
        for model in team.unique_models():
            original = model.generate

            def timed(*args, _orig=original, **kw):
                t0 = time.perf_counter()
                out = None
                try:
                    out = _orig(*args, **kw)
                    return out
                finally:
                    self._gen_total += time.perf_counter() - t0
                    self._calls_total += 1
                    ids = getattr(out, "sequences", out)
                    if isinstance(ids, torch.Tensor) and isinstance(kw.get("input_ids"), torch.Tensor):
                        self._tokens_total += ids.shape[0] * (ids.shape[1] - kw["input_ids"].shape[1])

            model.generate = timed

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._t0, self._c0 = time.perf_counter(), time.process_time()
        self._g0, self._n0, self._k0 = self._gen_total, self._calls_total, self._tokens_total

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.wall.append(time.perf_counter() - self._t0)
        self.cpu.append(time.process_time() - self._c0)
        self.gen.append(self._gen_total - self._g0)
        self.calls.append(self._calls_total - self._n0)
        self.tokens.append(self._tokens_total - self._k0)


def one_fit(model_dir: str, per_node: bool, args) -> StepTimer:
    items = [{"prompt": f"Topic: {TOPICS[i % len(TOPICS)]}."} for i in range(args.steps)]
    config = MAGRPOConfig(num_agents=2, num_turns=2, num_generations=4, joint_mode="aligned",
                          max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=None,
                          num_train_epochs=1, eval_interval=0, logging_steps=1, rollout_buffer_size=2,
                          agent_learning_rate=1e-6, seed=args.seed)
    trainer = MAGRPOTrainer(agent_model=model_dir, train_dataset=items, eval_dataset=None,
                            reward_func=cooperative_reward, formatters=FORMATTERS, args=config,
                            external_transition=plain_transition,
                            trainer_kwargs=dict(accelerator=args.accelerator, devices=1, logger=False,
                                                enable_checkpointing=False,
                                                enable_progress_bar=False, enable_model_summary=False,
                                                num_sanity_val_steps=0))
    if per_node:
        sample_per_node(trainer.module)
    timer = StepTimer(trainer.team)
    trainer.trainer.callbacks.append(timer)
    trainer.train()
    for series in (timer.wall, timer.cpu, timer.gen, timer.calls, timer.tokens):
        del series[0]  # warm-up step
    return timer


def lora_mixed(model_dir: str, args) -> tuple[list[float], list[float]]:
    """LoRA agents on one base: a level's generation as one call per agent (each with its adapter active)
    against one mixed-adapter call for all agents (peft ``adapter_names`` per row). Rows are the level's
    prompts repeated K times (``num_return_sequences`` cannot carry per-row adapters). Seconds per level."""
    from comlrl_lightning.agents import build_agents

    team = build_agents(model_dir, num_agents=2, lora={"r": 8, "lora_alpha": 16})
    model, tok = team.models[0], team.tokenizers[0]
    for name, p in model.named_parameters():  # non-zero adapters, so the two agents really differ
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    model.eval()
    prompts = [f"Topic: {TOPICS[i]}. Write one line." for i in range(4)] * 4  # 4 nodes x K = 4
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True)
    both = tok(prompts * 2, return_tensors="pt", padding=True)
    kw = dict(do_sample=True, top_k=0, max_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_token_id,
              eos_token_id=tok.eos_token_id)
    per_agent, mixed = [], []
    with torch.no_grad():
        for rep in range(1 + args.lora_reps):
            t0 = time.perf_counter()
            for a in range(2):
                with team.activate(a) as m:
                    m.generate(**enc, **kw)
            t1 = time.perf_counter()
            model.generate(**both, adapter_names=["agent_0"] * len(prompts) + ["agent_1"] * len(prompts), **kw)
            t2 = time.perf_counter()
            if rep:  # the first repetition warms up
                per_agent.append(t1 - t0)
                mixed.append(t2 - t1)
    return per_agent, mixed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and repetitions, tiny model only")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: steadier)")
    parser.add_argument("--models", default=None,
                        help="comma-separated: tiny, large, q05b (default tiny,large; --quick: tiny)")
    parser.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu",
                        help="Lightning accelerator of the fits (default cpu; gpu: one CUDA device)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per fit, first one untimed")
    parser.add_argument("--reps", type=int, default=None, help="fits per variant, alternating")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lora", action="store_true", help="only the LoRA mixed-adapter measurement (tiny model)")
    parser.add_argument("--lora-reps", type=int, default=7)
    args = parser.parse_args(argv)
    args.steps = args.steps if args.steps is not None else (4 if args.quick else 7)
    args.reps = args.reps if args.reps is not None else (1 if args.quick else 2)
    models = (args.models or ("tiny" if args.quick else "tiny,large")).split(",")
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    t_start = time.perf_counter()
    if args.lora:
        with tempfile.TemporaryDirectory(prefix="rollout_bench_") as tmp:
            per_agent, mixed = lora_mixed(build_tiny_model(Path(tmp) / "tiny"), args)
        pa, mx = statistics.median(per_agent), statistics.median(mixed)
        print(f"\nLoRA team (2 adapters on the tiny base), one level of 4 nodes x K=4, max_new_tokens="
              f"{args.max_new_tokens}, threads={torch.get_num_threads()}, {args.lora_reps} reps")
        print(f"one call per agent {1e3 * pa:.1f} ms; one mixed-adapter call {1e3 * mx:.1f} ms; "
              f"per-agent/mixed {pa / mx:.2f}x")
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="rollout_bench_") as tmp:
        tiny_dir = build_tiny_model(Path(tmp) / "tiny")
        dirs = {"tiny": tiny_dir}
        if "large" in models:
            dirs["large"] = build_large_model(tiny_dir, Path(tmp) / "large")
        if "q05b" in models:
            dirs["q05b"] = build_large_model(tiny_dir, Path(tmp) / "q05b", sizes=Q05B)
        unknown = sorted(set(models) - set(dirs))
        if unknown:
            parser.error(f"--models: unknown {unknown}; allowed: tiny, large, q05b")
        for label in models:
            timers = {"batched": [], "per-node": []}
            for _ in range(args.reps):
                for name, per_node in (("batched", False), ("per-node", True)):
                    timers[name].append(one_fit(dirs[label], per_node, args))
            rows.append((label, timers))

    print(f"\n2-turn MAGRPO training steps, 2 agents, G=4, aligned, max_new_tokens={args.max_new_tokens}, "
          f"torch {torch.__version__}, {args.accelerator}, threads={torch.get_num_threads()}, {args.reps} fit(s) x "
          f"{args.steps - 1} timed steps per variant")
    print(f"{'model':<8}{'variant':<11}{'ms/step':>9}{'steps/s':>9}{'cpu ms':>9}{'gen ms':>9}{'gen %':>7}"
          f"{'calls':>7}{'gen tok/s':>11}")
    for label, timers in rows:
        med = {}
        for name, ts in timers.items():
            wall = statistics.median([w for t in ts for w in t.wall])
            cpu = statistics.median([c for t in ts for c in t.cpu])
            gen = statistics.median([g for t in ts for g in t.gen])
            calls = statistics.median([c for t in ts for c in t.calls])
            rate = sum(k for t in ts for k in t.tokens) / max(1e-9, sum(g for t in ts for g in t.gen))
            med[name] = (wall, gen, cpu)
            print(f"{label:<8}{name:<11}{1e3 * wall:>9.1f}{1 / wall:>9.2f}{1e3 * cpu:>9.1f}{1e3 * gen:>9.1f}"
                  f"{100 * gen / wall:>6.0f}%{calls:>7.0f}{rate:>11.0f}")
        (bw, bg, bc), (pw, pg, pc) = med["batched"], med["per-node"]
        print(f"{label:<8}steps/s batched/per-node {pw / bw:.2f}x (cpu time {pc / bc:.2f}x); generate time "
              f"per-node/batched {pg / bg:.2f}x")
    print(f"total {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
