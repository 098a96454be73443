"""Code on a real model: the initial pass rate of SmolLM2-135M-Instruct on the easy tier of built-in problems.

The easy tier (``comlrl_lightning/envs/code/data/problems_easy.jsonl``, ``EASY_PROBLEMS``: 24 one-line problems) is
meant to be solved *sometimes* by a 135 M instruct model: the issue asks for an initial pass rate between 10 % and
60 % at temperature 1, so that 2-turn MAGRPO with ``level_feedback`` has something to learn. This script measures it
with the code environment's own prompts (``envs.code.FORMATTERS``: agent 0 writes ``aux``, agent 1 the entry
point), wrapped explicitly in the model's chat template, sampled at temperature 1 (no top-k/top-p filter), and
scored by the code environment's reward in the sandbox (``code_rewards``; bubblewrap).

    python benchmarks/real_code.py --seeds 0 1 2                 # 24 problems x 2 samples per seed
    python benchmarks/real_code.py --seeds 0 --samples 4 --problems 12

Printed per seed: the pass rate (all tests of a problem pass), the mean level reward (0..4, envs/code/rewards.py),
the share of main completions that define the entry point, and the wall time and generated tokens.

``--train``: 2-turn MAGRPO with ``level_feedback`` (aux/main, in the sandbox) on the first ``--train-problems``
easy problems, two LoRA agents (r 8, alpha 16, q/k/v/o) on one frozen base; before and after training, the
turn-1 pass rate and level reward on the last ``--held-out`` problems (``--eval-samples`` joint samples each,
fixed sampling streams at temperature 1, so "before" is the initial policy's figure on those problems). Turn-2
prompts are the transition's feedback prompts, wrapped in the chat template like turn 1.

    python benchmarks/real_code.py --train --seeds 0                 # 16 train / 8 held-out problems, G = 4

``--libs comlrl`` (run with ``.venv-bench/bin/python``, which has ``comlrl==1.4.3``; ``bash
benchmarks/make_bench_env.sh`` builds it): the same job in CoMLRL 1.4.3's ``MAGRPOTrainer``: two peft agents with
the same LoRA on the same cached HF folder, every shared option copied from ours, the same reward function, the same
chat-wrapped formatters and the same ``level_feedback`` transition object (``envs.code.make_code_transition`` takes
CoMLRL's transition call, keyword for keyword; the comlrl package ships no code transition of its own, so ours is
given to it, with the training problems registered). After training, CoMLRL's adapters are loaded into our team and
scored by the same held-out evaluation.

    .venv-bench/bin/python benchmarks/real_code.py --train --seeds 0 --libs comlrl --train-problems 12
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

PACKAGED = "packaged:smollm2-135m-instruct"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="sampling seeds, run one after the other")
    p.add_argument("--samples", type=int, default=2, help="joint samples per problem and seed (default 2)")
    p.add_argument("--problems", type=int, default=24, help="first N easy problems (default all 24)")
    p.add_argument("--max-new-tokens", type=int, default=96, help="completion budget per agent (default 96)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--train", action="store_true", help="2-turn MAGRPO with level_feedback, held-out before/after")
    p.add_argument("--train-problems", type=int, default=16, help="--train: the first N problems train (default 16)")
    p.add_argument("--held-out", type=int, default=8, help="--train: the last N problems are held out (default 8)")
    p.add_argument("--generations", type=int, default=4, help="--train: G per node (default 4)")
    p.add_argument("--lr", type=float, default=1e-3, help="--train: agent learning rate (default 1e-3)")
    p.add_argument("--eval-samples", type=int, default=4, help="--train: joint samples per held-out problem")
    p.add_argument("--libs", nargs="+", default=["ours"], choices=["ours", "comlrl"],
                   help="--train: which libraries train, per seed in this order (default ours)")
    p.add_argument("--json", default=None, help="--train: append one JSON line per run to this file")
    p.add_argument("--log-dir", default=None, help="--train: a CSVLogger folder (metrics.csv per seed, for "
                                                    "`comlrl-lightning report`); default: no logger")
    args = p.parse_args(argv)
    if args.samples < 1 or not 1 <= args.problems <= 24:
        p.error(f"--samples must be >= 1 and --problems in 1..24; got {args.samples}, {args.problems}")
    if args.train and (args.held_out < 1 or not 1 <= args.train_problems <= args.problems - args.held_out):
        p.error(f"--held-out must be >= 1 and --train-problems in 1..--problems minus --held-out "
                f"({args.problems} - {args.held_out}); got {args.held_out}, {args.train_problems}")
    if args.generations < 2 or args.eval_samples < 1:
        p.error(f"--generations must be >= 2 and --eval-samples >= 1; got {args.generations}, {args.eval_samples}")
    return args


def sample(model, tok, prompts: list[str], n: int, max_new_tokens: int, temperature: float, seed: int):
    """``n`` completions per prompt (texts, flat, prompt-major) and the number of generated tokens (to EOS)."""
    import torch

    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, temperature=temperature, top_p=1.0, top_k=0,
                             max_new_tokens=max_new_tokens, num_return_sequences=n, pad_token_id=tok.pad_token_id)
    texts, tokens = [], 0
    for row in out[:, enc["input_ids"].shape[1]:].tolist():
        k = next((i + 1 for i, t in enumerate(row) if t in (tok.eos_token_id, tok.pad_token_id)), len(row))
        tokens += k
        texts.append(tok.decode(row[:k], skip_special_tokens=True))
    return texts, tokens


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for k, v in (("WANDB_MODE", "disabled"), ("HF_HUB_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(k, v)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from comlrl_lightning.agents import load_tokenizer
    from comlrl_lightning.data.sources import chat_prompt
    from comlrl_lightning.envs.code import FORMATTERS, code_rewards, require_sandbox
    from comlrl_lightning.envs.code.problems import EASY_PROBLEMS, load_code_problems
    from comlrl_lightning.gguf import resolve_gguf

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    require_sandbox("bwrap", what="benchmarks/real_code.py")
    torch.set_num_threads(args.threads)
    folder = resolve_gguf(PACKAGED)
    tok = load_tokenizer(folder)
    items = [dict(r) for r in load_code_problems(EASY_PROBLEMS)][:args.problems]
    if args.train:
        return train(args, folder, tok, items)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    rows = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        texts, tokens = [], 0
        for a, fmt in enumerate(FORMATTERS):
            prompts = [chat_prompt(tok, fmt(it)) for it in items]
            got, n = sample(model, tok, prompts, args.samples, args.max_new_tokens, args.temperature,
                            seed * 1000 + a)
            texts.append(got)
            tokens += n
        wall = time.perf_counter() - t0
        paths = [it for it in items for _ in range(args.samples)]
        scores = code_rewards(texts[0], texts[1], paths, timeout_s=5.0)
        passed = [b.total_tests > 0 and b.passed == b.total_tests for b in scores]
        per_problem = [sum(passed[i * args.samples:(i + 1) * args.samples]) for i in range(len(items))]
        solved = [it["entry_point"] for it, k in zip(items, per_problem) if k]
        row = dict(seed=seed, pass_rate=sum(passed) / len(passed), level=statistics.mean(b.total for b in scores),
                   defines=statistics.mean(f"def {it['entry_point']}(" in t for it, t in zip(paths, texts[1])),
                   wall=wall, tokens=tokens)
        rows.append(row)
        print(f"seed {seed}: pass rate {row['pass_rate']:.3f}, level reward {row['level']:.3f}, main defines the "
              f"entry point {row['defines']:.2f}, {wall:.0f} s, {tokens} tokens; solved at least once: {solved}",
              flush=True)
    print(f"\nSmolLM2-135M-Instruct on the easy tier ({len(items)} problems x {args.samples} samples, temperature "
          f"{args.temperature:g}, {args.max_new_tokens} new tokens per agent)")
    print(f"{'seed':>5s}{'pass rate':>11s}{'level':>8s}{'defines':>9s}{'wall s':>8s}{'tokens':>8s}")
    for r in rows:
        print(f"{r['seed']:5d}{r['pass_rate']:11.3f}{r['level']:8.3f}{r['defines']:9.2f}{r['wall']:8.0f}"
              f"{r['tokens']:8d}")
    print(f"{'mean':>5s}{statistics.mean(r['pass_rate'] for r in rows):11.3f}"
          f"{statistics.mean(r['level'] for r in rows):8.3f}")
    return 0


def score(texts0: list[str], texts1: list[str], items: list[dict], n: int) -> dict:
    """Pass rate (every test passes) and mean level reward of ``n`` joint samples per item (item-major)."""
    import statistics

    from comlrl_lightning.envs.code import code_rewards

    paths = [it for it in items for _ in range(n)]
    scores = code_rewards(texts0, texts1, paths, timeout_s=5.0)
    passed = [b.total_tests > 0 and b.passed == b.total_tests for b in scores]
    return {"pass_rate": sum(passed) / len(passed), "level": statistics.mean(b.total for b in scores)}


def evaluate_turn1(team, tok, items: list[dict], n: int, max_new_tokens: int, temperature: float) -> dict:
    """Turn-1 pass rate and level reward of the team on ``items``, fixed sampling streams (seed 777 + agent)."""
    from comlrl_lightning.data.sources import chat_prompt
    from comlrl_lightning.envs.code import FORMATTERS

    texts, tokens = [], 0
    for a, fmt in enumerate(FORMATTERS):
        with team.activate(a) as model:
            model.eval()
            got, k = sample(model, tok, [chat_prompt(tok, fmt(it)) for it in items], n, max_new_tokens,
                            temperature, 777 + a)
        texts.append(got)
        tokens += k
    return {**score(texts[0], texts[1], items, n), "tokens": tokens}


def train(args, folder: str, tok, items: list[dict]) -> int:
    """2-turn MAGRPO with level_feedback on the first ``args.train_problems`` items; held-out before/after."""
    import torch

    from comlrl_lightning.config import MAGRPOConfig
    from comlrl_lightning.data.sources import chat_prompt
    from comlrl_lightning.envs.code import FORMATTERS, make_code_reward_func, make_code_transition
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from real_writing import LORA, comlrl_tokenizer, comlrl_trainer, timed_train

    def wrap(f):
        return lambda item, external_prompts=None: chat_prompt(tok, f(item, external_prompts))

    train_items, held_out = items[:args.train_problems], items[-args.held_out:]
    print(f"train {len(train_items)} problems, held out {len(held_out)}: {[it['entry_point'] for it in held_out]}")
    if "comlrl" in args.libs:
        import importlib.util

        if importlib.util.find_spec("comlrl") is None:
            raise SystemExit("--libs comlrl needs comlrl==1.4.3: bash benchmarks/make_bench_env.sh, then run with "
                             ".venv-bench/bin/python")
    formatters = [wrap(f) for f in FORMATTERS]
    rows, before = [], None
    for seed in args.seeds:
        for lib in args.libs:
            opts = dict(num_agents=2, num_turns=2, num_generations=args.generations, joint_mode="aligned",
                        num_train_epochs=1, agent_learning_rate=args.lr, max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature, top_p=1.0, top_k=None, rollout_buffer_size=1,
                        logging_steps=1, eval_interval=0, eval_num_samples=0, seed=seed)
            logger = False
            if args.log_dir and lib == "ours":
                from lightning.pytorch.loggers import CSVLogger

                logger = CSVLogger(args.log_dir, name=f"seed_{seed}")
            kw = dict(accelerator="cpu", devices=1, logger=logger, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      log_every_n_steps=1)
            seen, code_reward = [], make_code_reward_func(timeout_s=5.0)

            def reward(completions_agent0, completions_agent1, *, batch_items=None, _seen=seen, _f=code_reward):
                """The code reward, recording every value (a check that the reward reaches either library)."""
                out = _f(completions_agent0, completions_agent1, batch_items=batch_items)
                _seen.extend(out)
                return out

            reward.reward_range = code_reward.reward_range
            ours = MAGRPOTrainer(agent_model=folder, lora=LORA, train_dataset=train_items,
                                 reward_func=reward, formatters=formatters,
                                 external_transition=make_code_transition("level_feedback", sandbox_slice=1,
                                                                          timeout_s=5.0),
                                 args=MAGRPOConfig(**opts), trainer_kwargs=kw)
            if before is None:  # LoRA starts as the identity and the streams are fixed: one "before" for all runs
                before = evaluate_turn1(ours.team, tok, held_out, args.eval_samples, args.max_new_tokens,
                                        args.temperature)
                print(f"before: {before}", flush=True)
            theirs = None
            if lib == "comlrl":
                theirs = comlrl_trainer(
                    "magrpo", ours, folder, tok, train_items, reward_func=reward, formatters=formatters,
                    external_transition=make_code_transition("level_feedback", problems=train_items,
                                                             sandbox_slice=1, timeout_s=5.0))
                torch.manual_seed(seed)
            # CoMLRL's agents pad finished rows with its tokenizer copy's pad (``<|endoftext|>``), not the EOS
            ends = {tok.eos_token_id, tok.pad_token_id, comlrl_tokenizer(tok).pad_token_id}
            counts, wall, load = timed_train(ours, theirs, ends)
            del theirs
            after = evaluate_turn1(ours.team, tok, held_out, args.eval_samples, args.max_new_tokens,
                                   args.temperature)
            train_reward = statistics.mean(seen) if seen else float("nan")
            row = dict(lib=lib, seed=seed, lr=args.lr, generations=args.generations, before=before, after=after,
                       wall=wall, tokens=counts.tokens, steps=counts.opt_steps, load=load,
                       train_reward=train_reward, rewards=len(seen))
            rows.append(row)
            if args.json:
                import json

                with open(args.json, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
            print(f"{lib} seed {seed} after: {after}, wall {wall:.0f} s, tokens {counts.tokens}, opt steps "
                  f"{counts.opt_steps}, training reward {train_reward:.3f} over {len(seen)} joint samples, load "
                  f"before {load:.2f}", flush=True)
            del ours
    print(f"\n2-turn MAGRPO, level_feedback, G = {args.generations}, lr {args.lr:g}, {len(train_items)} train "
          f"problems; held out: {len(held_out)} x {args.eval_samples} turn-1 joint samples, temperature "
          f"{args.temperature:g}")
    print(f"{'library':9s}{'seed':>5s}{'pass before':>13s}{'pass after':>12s}{'level before':>14s}"
          f"{'level after':>13s}{'wall s':>8s}{'tokens':>8s}{'steps':>7s}")
    for r in rows:
        print(f"{r['lib']:9s}{r['seed']:5d}{r['before']['pass_rate']:13.3f}{r['after']['pass_rate']:12.3f}"
              f"{r['before']['level']:14.3f}{r['after']['level']:13.3f}{r['wall']:8.0f}{r['tokens']:8d}"
              f"{r['steps']:7d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
