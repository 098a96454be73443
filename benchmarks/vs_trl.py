"""One agent, the same GRPO job in TRL's ``GRPOTrainer`` and our ``MAGRPOTrainer(num_agents=1)``, and a bare floor.

Needs ``trl==1.16.*`` for the TRL side: the ``bench`` extra, in its own environment (``bash
benchmarks/make_bench_env.sh`` builds ``.venv-bench``). Without trl the script says how to install it and exits 2
(``--libs ours floor`` runs without it).

    .venv-bench/bin/python benchmarks/vs_trl.py                  # the 30m job, 2 runs per library (~5 min idle)
    .venv-bench/bin/python benchmarks/vs_trl.py --model tiny     # the same job on the embedded tiny model
    .venv-bench/bin/python benchmarks/vs_trl.py --reps 1 --threads 2 --libs ours trl

The job (issue #25):

  model    ``30m``: a random Qwen2 with the embedded model's tokenizer (512-token vocabulary), 8 layers, hidden
           512, 8 heads / 4 KV heads, intermediate 2048, tied embeddings: 31.5 M parameters (built by
           ``madpo_step.build_large_model``, the builder the other benchmarks share); ``tiny``: the embedded model
           (``comlrl_lightning.tiny``, 0.16 M parameters). Both are written to a temporary folder and every process
           loads them from there (offline).
  data     24 fixed English prompts (``PROMPTS``), as a list of ``{"prompt": ...}`` items (ours) and a
           ``datasets.Dataset.from_list`` of the same items (TRL); no chat template on either side.
  reward   ``vowel_share``: the share of the completion's characters that are vowels (0 for an empty one).
  rollout  G = 4 completions per prompt, 12 new tokens, temperature 1, no top-p/top-k filter.
  update   2 prompts (8 completions) per optimizer step, one minibatch: ours ``rollout_buffer_size=2`` and
           ``train_batch_size=2`` node samples (docs/multiturn.md §2.9), TRL ``per_device_train_batch_size=8``,
           ``steps_per_generation=1`` (so ``generation_batch_size=8``: one generation per optimizer step, on
           policy). 24 prompts x 2 epochs = 24 AdamW steps on each side, learning rate 2e-3, no KL (``beta=0``).

TRL's options where its defaults would change the arithmetic, set to ours (docs/multiturn.md §1.1, §2.8):
``loss_type="dr_grpo"`` (per completion the sum of its token terms, averaged over completions; ours is the same
up to a constant factor, which AdamW ignores), ``scale_rewards="group"`` (z-normalised within a prompt's group, as
``advantage_normalization``), ``lr_scheduler_type="constant"``, ``weight_decay=0.01`` (torch AdamW's default,
which ours uses), ``max_grad_norm=0`` (ours does not clip), ``bf16=False`` and ``gradient_checkpointing=False``
(ours trains in float32 without checkpointing), ``use_cpu=True``, no vLLM, ``report_to="none"``,
``save_strategy="no"``, logging only at the end (``logging_steps`` past the last step), ``disable_tqdm=True``.
TRL keeps its optimizer (``adamw_torch_fused``), its sampler and everything else; ours keeps its defaults
(Lightning ``Trainer`` on the CPU, no logger, no checkpoints, no progress bar).

Each run is its own process (``--worker``), so peak RSS is each library's alone; the libraries alternate run by
run (``ours, trl, floor, ours, trl, floor, ...``) so a slow phase of the machine hits all of them. Timed: ``train()``
(TRL's ``trainer.train()``, ours ``MAGRPOTrainer.train()``); loading and building are not. Per run: wall and CPU
seconds (``time.process_time``; with one thread it leaves out the time the process waited for a core), AdamW
steps (a global ``torch.optim`` step hook), ``generate`` calls and the sequences they return, forwards outside
``generate`` (benchmarks/vs_comlrl.py's counters), peak RSS of the process (``ru_maxrss``: loading included) and
the 1-minute load average before the run. Learning: every process evaluates its model before and after training
with the same code (``evaluate``: 8 samples per prompt, one fixed seed), so "before" is the same number everywhere
and the delta is comparable.

The floor (``--libs ... floor``): the same job with no library, the least any implementation does: per optimizer
step one batched ``generate`` over the step's 2 prompts x G rows, rewards and group-normalised advantages, then one
forward over the same rows (logits of the completion positions only, ``logits_to_keep``), backward and a fused
AdamW step. ``ours/floor`` is our time over that (target <= 1.2x).

Printed: the runs, then per library the medians, and the ratios of this run: TRL/ours of time (our speed-up;
target >= 1.0x on 30m, >= 1.2x on tiny), ours/TRL of peak RSS (target <= 1.05x), the learning deltas (equal within
0.05), ours/floor. Ratios of wall time are the headline, with CPU-time ratios beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

TRL_VERSION = "1.16"
LIBS = ("ours", "trl", "floor")
SIZES_30M = {"num_hidden_layers": 8, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 4,
             "intermediate_size": 2048}
EVAL_SEED = 1234
EVAL_SAMPLES = 8
PROMPTS = [
    "Tell me about the sea.", "Name a color you like.", "What is a good breakfast?", "Describe your town.",
    "Write a line about rain.", "Say hello to a friend.", "Which animal is the fastest?", "Give me a word.",
    "What makes a song good?", "Describe the night sky.", "How do birds fly?", "Write about an old tree.",
    "Name a river.", "What is in the box?", "Tell a short story.", "Why is the sky blue?", "Pick a number.",
    "Describe a quiet morning.", "What do cats dream of?", "Write a title for a book.", "Where is the key?",
    "Say something kind.", "What is a mountain?", "Describe winter.",
]
TARGETS = {"30m": 1.0, "tiny": 1.2}  # TRL time / our time, issue #25
RSS_TARGET = 1.05
DELTA_TOLERANCE = 0.05
FLOOR_TARGET = 1.2
MISSING = (f"benchmarks/vs_trl.py needs trl=={TRL_VERSION}.*, which is not importable here.\n"
           "Build the benchmark environment (the `bench` extra, kept out of the main one):\n"
           "  bash benchmarks/make_bench_env.sh\n"
           "  .venv-bench/bin/python benchmarks/vs_trl.py\n"
           "or run without TRL: --libs ours floor")


@dataclass
class Job:
    """The workload both libraries run (module docstring)."""

    prompts: int = 24
    generations: int = 4
    new_tokens: int = 12
    prompts_per_step: int = 2
    epochs: int = 2
    lr: float = 2e-3
    seed: int = 0

    @property
    def steps(self) -> int:
        """Optimizer steps of the whole job."""
        return self.epochs * -(-self.prompts // self.prompts_per_step)

    def items(self) -> list[dict]:
        return [{"prompt": PROMPTS[i % len(PROMPTS)]} for i in range(self.prompts)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("30m", "tiny"), default="30m", help="30m (default) or the embedded tiny model")
    p.add_argument("--reps", type=int, default=2, help="runs per library, alternating (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads in every run (default 1)")
    p.add_argument("--libs", nargs="+", choices=LIBS, default=list(LIBS), help="what to run (default: all three)")
    p.add_argument("--prompts", type=int, default=24, help=f"train prompts, at most {len(PROMPTS)} distinct (24)")
    p.add_argument("--epochs", type=int, default=2, help="passes over the prompts (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of every run (default 0)")
    p.add_argument("--ours", action="append", default=[], metavar="KEY=VALUE",
                   help="extra MAGRPOConfig option for ours (JSON value), e.g. --ours agent_overlap=\"off\"")
    p.add_argument("--json", type=Path, default=None, help="also write every run and the summary to this file")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    # internal: one run in this process
    p.add_argument("--worker", choices=LIBS, help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("reps", "threads", "prompts", "epochs"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.prompts % 2:
        p.error(f"--prompts must be even (2 prompts per optimizer step), got {args.prompts}")
    try:
        args.ours_overrides = parse_overrides(args.ours)
    except ValueError as exc:
        p.error(str(exc))
    return args


def parse_overrides(pairs: list[str]) -> dict:
    """``["k=v", ...]`` -> ``{k: json(v)}`` (a value that is not JSON stays a string)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--ours takes KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def job_of(args: argparse.Namespace) -> Job:
    return Job(prompts=args.prompts, epochs=args.epochs, seed=args.seed)


def trl_version() -> str | None:
    """The installed trl version, or None when trl is not importable."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        return None
    try:
        return importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------------- the task
def vowel_share(completions: list[str], **kwargs) -> list[float]:
    """Per completion, the share of its characters that are vowels (aeiou, any case); 0 for an empty one.

    TRL calls it with ``prompts=``, ``completions=``... keywords, ours with the completions alone."""
    return [sum(c in "aeiouAEIOU" for c in text) / len(text) if text else 0.0 for text in completions]


def _left_padded(tok, prompts: list[str]):
    side = tok.padding_side
    tok.padding_side = "left"
    try:
        return tok(prompts, return_tensors="pt", padding=True)
    finally:
        tok.padding_side = side


def _sample(model, tok, prompts: list[str], samples: int, new_tokens: int):
    """One batched ``generate``: (sequences, prompt width, completion texts), rows prompt-major."""
    enc = _left_padded(tok, prompts)
    out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens,
                         num_return_sequences=samples, pad_token_id=tok.pad_token_id)
    width = enc["input_ids"].shape[1]
    texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
    return out, width, enc["attention_mask"].repeat_interleave(samples, 0), texts


def evaluate(model, tok, prompts: list[str], new_tokens: int = 12) -> float:
    """Mean ``vowel_share`` of ``EVAL_SAMPLES`` samples per prompt, drawn with ``EVAL_SEED`` (torch's global RNG is
    restored after): the same number for the same weights in every process."""
    import torch

    was_training = model.training
    model.eval()
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(EVAL_SEED)
        texts = _sample(model, tok, prompts, EVAL_SAMPLES, new_tokens)[3]
    model.train(was_training)
    return statistics.fmean(vowel_share(texts))


# ---------------------------------------------------------------------------------------------------- the runs
def ours_trainer(job: Job, model_dir: str, root: str, overrides: dict | None = None):
    """``MAGRPOTrainer(num_agents=1)`` on the job."""
    from recipes import _cpu_trainer_kwargs

    from comlrl_lightning.config import MAGRPOConfig
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    kw = dict(num_agents=1, num_turns=1, num_generations=job.generations, max_new_tokens=job.new_tokens,
              temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=job.lr, num_train_epochs=job.epochs,
              rollout_buffer_size=job.prompts_per_step, train_batch_size=job.prompts_per_step,
              reference_kl_enabled=False, eval_interval=0, eval_num_samples=0, logging_steps=10**9, seed=job.seed)
    kw.update(overrides or {})
    kwargs = _cpu_trainer_kwargs(root)
    kwargs["log_every_n_steps"] = 10**9
    return MAGRPOTrainer(agent_model=model_dir, num_agents=1, train_dataset=job.items(), reward_func=vowel_share,
                         args=MAGRPOConfig(**kw), trainer_kwargs=kwargs)


def trl_trainer(job: Job, model_dir: str, root: str):
    """TRL's ``GRPOTrainer`` on the job (module docstring: the options set and why)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    cfg = GRPOConfig(
        output_dir=root, per_device_train_batch_size=job.prompts_per_step * job.generations, steps_per_generation=1,
        num_generations=job.generations, max_completion_length=job.new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, learning_rate=job.lr, num_train_epochs=job.epochs, loss_type="dr_grpo", scale_rewards="group",
        lr_scheduler_type="constant", weight_decay=0.01, max_grad_norm=0.0, bf16=False, gradient_checkpointing=False,
        use_cpu=True, use_vllm=False, report_to="none", save_strategy="no", logging_steps=10**9, disable_tqdm=True,
        seed=job.seed, dataloader_num_workers=0)
    return GRPOTrainer(model=model_dir, reward_funcs=vowel_share, args=cfg,
                       train_dataset=Dataset.from_list(job.items()))


def floor_run(job: Job, model, tok):
    """The job with no library (module docstring): returns a function that trains ``model`` in place."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=job.lr, fused=True)
    prompts = [it["prompt"] for it in job.items()]
    g = torch.Generator().manual_seed(job.seed)
    eos = tok.eos_token_id

    def train() -> None:
        torch.manual_seed(job.seed)
        for _ in range(job.epochs):
            order = torch.randperm(len(prompts), generator=g).tolist()
            for s in range(0, len(order), job.prompts_per_step):
                batch = [prompts[i] for i in order[s:s + job.prompts_per_step]]
                model.eval()
                with torch.no_grad():
                    seqs, width, prompt_mask, texts = _sample(model, tok, batch, job.generations, job.new_tokens)
                model.train()
                comp = seqs[:, width:]
                is_eos = comp == eos
                # completion tokens up to and including the first EOS
                mask = ((is_eos.cumsum(1) - is_eos.long()) == 0).float()
                r = torch.tensor(vowel_share(texts)).view(-1, job.generations)
                adv = ((r - r.mean(1, keepdim=True)) / r.std(1, unbiased=False, keepdim=True).clamp(min=1e-6)).view(-1)
                attn = torch.cat([prompt_mask, torch.ones_like(comp)], 1)
                logits = model(input_ids=seqs, attention_mask=attn, logits_to_keep=comp.shape[1] + 1).logits[:, :-1]
                logp = torch.log_softmax(logits.float(), -1).gather(-1, comp.unsqueeze(-1)).squeeze(-1)
                loss = -(adv[:, None] * logp * mask).sum(1).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

    return train


def timed(train, model) -> tuple[float, float, dict]:
    """(wall s, CPU s, counts) of ``train()``, with benchmarks/vs_comlrl.py's counters, except that forwards are
    counted by a pre-hook on ``model`` itself: TRL (through accelerate) calls a forward bound before the run, which
    a patch of the class would miss."""
    from vs_comlrl import Counts, counting

    counts = Counts()
    fwd = {"fwd_calls": 0, "fwd_rows": 0, "fwd_tokens": 0}

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if not counts._in_generate and ids is not None:
            fwd["fwd_calls"] += 1
            fwd["fwd_rows"] += int(ids.shape[0])
            fwd["fwd_tokens"] += int(ids.numel())

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with counting(counts):
            c0, t0 = time.process_time(), time.perf_counter()
            train()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        handle.remove()
    return wall, cpu, {**counts.as_dict(), **fwd}


def worker(args: argparse.Namespace) -> dict:
    """One run of one library in this process: build (untimed), evaluate, train (timed), evaluate."""
    import logging
    import warnings

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    job = job_of(args)
    prompts = [it["prompt"] for it in job.items()]
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    root = tempfile.mkdtemp(prefix=f"vs_trl_{args.worker}_")
    load = os.getloadavg()[0]
    if args.worker == "ours":
        tr = ours_trainer(job, args.model_dir, root, args.ours_overrides)
        model, train = tr.team.models[0], tr.train
    elif args.worker == "trl":
        tr = trl_trainer(job, args.model_dir, root)
        model, train = tr.model, tr.train
    else:
        torch.manual_seed(job.seed)
        model = AutoModelForCausalLM.from_pretrained(args.model_dir)
        train = floor_run(job, model, tok)
    before = evaluate(model, tok, prompts, job.new_tokens)
    wall, cpu, counts = timed(train, model)
    threads = torch.get_num_threads()
    after = evaluate(model, tok, prompts, job.new_tokens)
    import comlrl_lightning

    return {"lib": args.worker, "wall": wall, "cpu": cpu, "counts": counts, "threads": threads,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "before": before,
            "after": after, "delta": after - before, "load": load,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "comlrl_lightning": str(Path(comlrl_lightning.__file__).parent)}


def run_child(lib: str, model_dir: str, args: argparse.Namespace, out: Path) -> dict:
    """One ``--worker`` process; its result (raises with its output when it fails)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", lib, "--model-dir", model_dir, "--out", str(out),
           "--threads", str(args.threads), "--prompts", str(args.prompts), "--epochs", str(args.epochs),
           "--seed", str(args.seed), *[f"--ours={o}" for o in args.ours]]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false",
               TRANSFORMERS_VERBOSITY="error")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the {lib} run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-5000:]}")
    return json.loads(out.read_text())


# ---------------------------------------------------------------------------------------------------- the report
def ratio(num: float, den: float) -> float:
    return num / den if den else float("inf")


def verdict(value: float, op: str, bound: float) -> str:
    """``"target >= 1.2x  PASS"``-style text for ``value op bound``."""
    ok = value >= bound if op == ">=" else value <= bound
    return f"target {op} {bound:g}x  {'PASS' if ok else 'FAIL'}"


def summarize(runs: list[dict]) -> dict[str, dict]:
    """Medians per library: wall, cpu, peak RSS, delta, before, and the median counts."""
    out = {}
    for lib in LIBS:
        rs = [r for r in runs if r["lib"] == lib]
        if not rs:
            continue
        med = {k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu", "peak_rss_mb", "delta", "before",
                                                                 "after", "load")}
        med["counts"] = {k: statistics.median(r["counts"][k] for r in rs) for k in rs[0]["counts"]}
        med["n"] = len(rs)
        out[lib] = med
    return out


def ratio_lines(summary: dict[str, dict], model: str) -> tuple[list[str], bool]:
    """The ratio lines of the report and whether every target that applies was met."""
    lines, ok = [], True
    ours, trl, floor = summary.get("ours"), summary.get("trl"), summary.get("floor")
    if ours and trl:
        speed, speed_cpu = ratio(trl["wall"], ours["wall"]), ratio(trl["cpu"], ours["cpu"])
        v = verdict(speed, ">=", TARGETS[model])
        lines.append(f"TRL/ours time (our speed-up): {speed:.2f}x (cpu {speed_cpu:.2f}x)  {v}")
        rss = ratio(ours["peak_rss_mb"], trl["peak_rss_mb"])
        v2 = verdict(rss, "<=", RSS_TARGET)
        lines.append(f"ours/TRL peak RSS: {rss:.2f}x ({ours['peak_rss_mb']:.0f} / {trl['peak_rss_mb']:.0f} MB)  {v2}")
        diff = abs(ours["delta"] - trl["delta"])
        v3 = "PASS" if diff <= DELTA_TOLERANCE else "FAIL"
        lines.append(f"learning delta: ours {ours['delta']:+.3f}, TRL {trl['delta']:+.3f} (before "
                     f"{ours['before']:.3f}), |difference| {diff:.3f}  target <= {DELTA_TOLERANCE:g}  {v3}")
        ok &= v.endswith("PASS") and v2.endswith("PASS") and v3 == "PASS"
    if ours and floor:
        over, over_cpu = ratio(ours["wall"], floor["wall"]), ratio(ours["cpu"], floor["cpu"])
        v = verdict(over, "<=", FLOOR_TARGET)
        lines.append(f"ours/floor time: {over:.2f}x (cpu {over_cpu:.2f}x)  {v}")
        ok &= v.endswith("PASS")
    if trl and floor:
        lines.append(f"TRL/floor time: {ratio(trl['wall'], floor['wall']):.2f}x "
                     f"(cpu {ratio(trl['cpu'], floor['cpu']):.2f}x)")
    return lines, ok


def run_line(r: dict) -> str:
    c = r["counts"]
    return (f"{r['lib']:6s}{r['wall']:8.2f}{r['cpu']:8.2f}{c['opt_steps']:6.0f}{c['gen_calls']:6.0f}{c['samples']:6.0f}"
            f"{c['fwd_calls']:6.0f}{c['fwd_tokens']:8.0f}{c['gen_s']:7.2f}{r['peak_rss_mb']:8.0f}{r['before']:7.3f}"
            f"{r['after']:7.3f}{r['delta']:+7.3f}{r['load']:6.2f}")


HEAD = (f"{'lib':6s}{'wall s':>8s}{'cpu s':>8s}{'steps':>6s}{'gen':>6s}{'rows':>6s}{'fwd':>6s}{'fwd tok':>8s}"
        f"{'gen s':>7s}{'RSS MB':>8s}{'before':>7s}{'after':>7s}{'delta':>7s}{'load':>6s}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        result = worker(args)
        args.out.write_text(json.dumps(result))
        return 0
    version = trl_version() if "trl" in args.libs else "-"
    if version is None:
        print(MISSING, file=sys.stderr)
        return 2
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    job = job_of(args)
    start = time.perf_counter()
    uptime = os.popen("uptime").read().strip()
    runs = []
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp:
        from comlrl_lightning.tiny import build_tiny_model

        tiny = build_tiny_model(Path(tmp) / "tiny")
        if args.model == "tiny":
            model_dir = tiny
        else:
            from madpo_step import build_large_model

            model_dir = build_large_model(tiny, Path(tmp) / "30m", seed=0, sizes=SIZES_30M)
        print(f"TRL {version} vs comlrl-lightning, one agent: {args.model} model, {job.prompts} prompts x G="
              f"{job.generations} x {job.new_tokens} tokens, {job.prompts_per_step} prompts per step, {job.epochs} "
              f"epochs ({job.steps} steps), lr {job.lr:g}, threads={args.threads}, torch {torch.__version__}; "
              f"{uptime}", flush=True)
        print(HEAD, flush=True)
        for rep in range(args.reps):
            for lib in args.libs:
                r = run_child(lib, model_dir, args, Path(tmp) / f"{lib}_{rep}.json")
                runs.append(r)
                print(run_line(r), flush=True)
    summary = summarize(runs)
    print(f"\nmedians of {args.reps} run(s), {summary[args.libs[0]]['n']} each; params {runs[0]['params_m']:.2f} M; "
          f"comlrl_lightning from {runs[0]['comlrl_lightning']}")
    print(HEAD)
    for lib, med in summary.items():
        print(run_line({"lib": lib, **med}))
    lines, ok = ratio_lines(summary, args.model)
    for line in lines:
        print(line)
    print(f"load after: {os.popen('uptime').read().strip()}; total {time.perf_counter() - start:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"job": asdict(job), "model": args.model, "threads": args.threads,
                                         "trl": version, "runs": runs, "summary": summary, "ratios": lines}, indent=1))
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
