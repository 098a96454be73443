"""Cost of one MADPO training step on CPU: ours vs a bare floor vs the spec's two-pass formulation.

Run ``python benchmarks/madpo_step.py [--quick] [--threads N]``. For two models (the embedded tiny Qwen2 and
a larger random Qwen2: 8 layers, hidden 256, 4 heads / 2 KV heads, intermediate 1024, same tokenizer),
2 agents and one batch of random-token preference pairs (fixed seed), it times one optimizer update of
every agent with:

  (a) ours      MADPOModule's fast path: per agent ONE forward over winner+loser rows, ``madpo_loss``,
                one backward of the joint loss, one AdamW step per agent. Called through the module's
                own pieces (``_agent_logps``, ``_check_finite``) without a Lightning Trainer, so no
                Trainer/logging overhead enters any variant.
  (b) floor     per agent a bare forward + token cross-entropy on the same scored tokens + backward +
                AdamW step: what any LM training step over these tokens costs, no MADPO math.
  (c) two-pass  docs/preference.md §7.1 literally, batched: a no-grad forward per agent for all margins,
                then per agent a graded forward, ``madpo_loss_detached_others``, backward, step. This is
                the module's own ``_sequential_step`` (its shared-parameter path), with
                ``manual_backward`` replaced by ``loss.backward()``.
  (d) unbatched upstream's cost model (docs/preference.md §7.1 "4 single-sequence forwards per agent per pair"): the
  two-pass
                formulation with one forward per row.

A fifth line, ``no-grad fwd``, times only the no-grad forward of every agent (the work the two-pass adds):
two-pass = ours + no-grad fwd when neither wastes anything, so ``1 + no-grad fwd / ours`` is the ratio the
two-pass can be expected to reach: about 1 + F / (F + B + S) with backward B ~ 2 forwards F, i.e. ~1.3x.

Every variant trains the same models with the same optimizers; warm-up steps create the AdamW state, then
the variants are timed interleaved (one step of each per repetition) and the median is reported.
The ratios printed are measured in this run: ours/floor (target <= 1.3x), two-pass/ours (target >= 1.4x)
and unbatched/ours (target >= 1.4x: it is a two-pass too, so it must cost at least as much).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers

from comlrl_lightning.agents import load_model, load_tokenizer
from comlrl_lightning.config import MADPOConfig
from comlrl_lightning.logprobs import build_scoring_batch, sequence_logps
from comlrl_lightning.losses import madpo_loss, madpo_loss_detached_others
from comlrl_lightning.modules.madpo import MADPOModule
from comlrl_lightning.tiny import build_tiny_model

NUM_AGENTS = 2
BETA = 0.1
LR = 1e-6  # small: the timed steps must not drive the random models to non-finite losses

LARGE = {"num_hidden_layers": 8, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 1024}

TARGETS = {  # name: (numerator, denominator, comparison, bound)
    "ours/floor": ("ours", "floor", "<=", 1.3),
    "two-pass/ours": ("two-pass", "ours", ">=", 1.4),
    "unbatched/ours": ("unbatched", "ours", ">=", 1.4),
}


def build_large_model(tiny_dir: str, out_dir: Path, seed: int = 0, sizes: dict | None = None) -> str:
    """A random Qwen2 with the tiny model's tokenizer and config except the sizes in ``sizes`` (default
    ``LARGE``)."""
    from transformers import AutoConfig, AutoTokenizer, Qwen2ForCausalLM

    config = AutoConfig.from_pretrained(tiny_dir)
    for k, v in (sizes or LARGE).items():
        setattr(config, k, v)
    config.head_dim = config.hidden_size // config.num_attention_heads
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(out_dir)
    return str(out_dir)


def random_pairs(tok, num_pairs: int, prompt_len: int, completion_len: int, seed: int) -> list[list[tuple]]:
    """Per agent, ``num_pairs`` (prompt, winner, loser) id lists; lengths vary by ±25% around the means.

    Ids are drawn from the ordinary (non-special) vocabulary, so no completion is cut at a pad token.
    """
    g = torch.Generator().manual_seed(seed)
    special = set(tok.all_special_ids)
    vocab = torch.tensor([i for i in range(len(tok)) if i not in special])

    def seq(mean: int) -> list[int]:
        n = int(torch.randint(mean - mean // 4, mean + mean // 4 + 1, (1,), generator=g))
        return vocab[torch.randint(len(vocab), (n,), generator=g)].tolist()

    return [[(seq(prompt_len), seq(completion_len), seq(completion_len)) for _ in range(num_pairs)]
            for _ in range(NUM_AGENTS)]


def make_batch(pairs: list[list[tuple]], pad_id: int) -> dict:
    """The collate output of ``PreferenceDataModule`` (winners rows 0..B-1, losers B..2B-1) plus, per agent,
    one single-row scoring batch per row for the unbatched variant."""
    agents, single = [], []
    for agent_pairs in pairs:
        prompts = [p for p, _, _ in agent_pairs] * 2
        comps = [w for _, w, _ in agent_pairs] + [lo for _, _, lo in agent_pairs]
        agents.append(build_scoring_batch(prompts, comps, pad_id, drop_last=True))
        single.append([build_scoring_batch([p], [c], pad_id, drop_last=True) for p, c in zip(prompts, comps)])
    b = len(pairs[0])
    return {"agents": agents, "single_rows": single, "pair_index": torch.arange(b)}


def make_steps(module: MADPOModule, opts: list, batch: dict) -> dict[str, Callable[[], None]]:
    team = module.team
    n = team.num_agents
    b = int(batch["pair_index"].numel())

    def ours() -> None:  # MADPOModule.training_step, separate-parameter path (minus Trainer logging)
        logps = [module._agent_logps(batch, i) for i in range(n)]
        winner = torch.stack([w for w, _ in logps])
        loser = torch.stack([lo for _, lo in logps])
        per_pair, _ = madpo_loss(winner, loser, BETA)
        module._check_finite(per_pair, batch)
        per_pair.mean().backward()
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)

    def floor() -> None:
        for i, opt in enumerate(opts):
            rows = batch["agents"][i]
            with team.activate(i) as model:
                logits = model(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"],
                               use_cache=False).logits
            labels = rows["input_ids"][:, 1:].masked_fill(rows["score_mask"][:, 1:] == 0, -100)
            F.cross_entropy(logits[:, :-1].flatten(0, 1), labels.flatten()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    def two_pass() -> None:
        module._sequential_step(batch, opts, BETA)
        for opt in opts:  # the module zeroes before each agent's pass; leave no grads behind either way
            opt.zero_grad(set_to_none=True)

    def unbatched() -> None:
        def logps(i: int) -> tuple[torch.Tensor, torch.Tensor]:
            with team.activate(i) as model:
                lp = torch.cat([sequence_logps(model, r) for r in batch["single_rows"][i]])
            return lp[:b], lp[b:]

        with torch.no_grad():
            det = [logps(i) for i in range(n)]
        winner = torch.stack([w for w, _ in det])
        loser = torch.stack([lo for _, lo in det])
        for i, opt in enumerate(opts):
            opt.zero_grad(set_to_none=True)
            w_i, l_i = logps(i)
            w = torch.cat([winner[:i], w_i.unsqueeze(0), winner[i + 1:]])
            lo = torch.cat([loser[:i], l_i.unsqueeze(0), loser[i + 1:]])
            madpo_loss_detached_others(w, lo, BETA, i).backward()
            opt.step()
        for opt in opts:
            opt.zero_grad(set_to_none=True)

    def nograd_forward() -> None:  # not a step: the extra work the two-pass adds to ours
        with torch.no_grad():
            for i in range(n):
                module._agent_logps(batch, i, grad=False)

    return {"ours": ours, "floor": floor, "two-pass": two_pass, "unbatched": unbatched,
            "no-grad fwd": nograd_forward}


def gradient_check(module: MADPOModule, batch: dict) -> float:
    """Max |grad(ours) - grad(spec's detached loss)| over all parameters, at the current weights (no step)."""
    team, n = module.team, module.team.num_agents
    logps = [module._agent_logps(batch, i) for i in range(n)]
    winner = torch.stack([w for w, _ in logps])
    loser = torch.stack([lo for _, lo in logps])
    madpo_loss(winner, loser, BETA)[0].mean().backward()
    joint = [[p.grad.clone() for p in team.parameters_of(i)] for i in range(n)]
    module.zero_grad(set_to_none=True)
    diff = 0.0
    for i in range(n):
        w_i, l_i = module._agent_logps(batch, i)
        w = torch.cat([winner[:i].detach(), w_i.unsqueeze(0), winner[i + 1:].detach()])
        lo = torch.cat([loser[:i].detach(), l_i.unsqueeze(0), loser[i + 1:].detach()])
        madpo_loss_detached_others(w, lo, BETA, i).backward()
        for g, p in zip(joint[i], team.parameters_of(i)):
            diff = max(diff, (g - p.grad).abs().max().item())
    module.zero_grad(set_to_none=True)
    return diff


def bench(steps: dict[str, Callable[[], None]], warmup: int, reps: int) -> dict[str, dict[str, list[float]]]:
    """Per variant the wall times (``perf_counter``) and process CPU times (``process_time``) of ``reps`` calls."""
    for _ in range(warmup):
        for fn in steps.values():
            fn()
    times = {k: {"wall": [], "cpu": []} for k in steps}
    for _ in range(reps):  # interleaved, so slow drifts of the machine hit every variant alike
        for name, fn in steps.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            times[name]["wall"].append(time.perf_counter() - t0)
            times[name]["cpu"].append(time.process_time() - c0)
    return times


def run_model(label: str, path: str, tok, args) -> tuple[dict, float, int, int]:
    models = [load_model(path) for _ in range(NUM_AGENTS)]
    module = MADPOModule(agents=models, tokenizer=tok,
                         args=MADPOConfig(num_agents=NUM_AGENTS, dpo_beta=BETA, agent_learning_rate=LR))
    module.on_fit_start()  # train mode, as in a fit
    module.manual_backward = lambda loss, *a, **k: loss.backward()  # no Trainer: plain autograd
    opts = module.configure_optimizers()
    pairs = random_pairs(tok, args.pairs, args.prompt_len, args.completion_len, args.seed)
    batch = make_batch(pairs, tok.pad_token_id)
    steps = make_steps(module, opts, batch)
    if args.quick and label != "tiny":
        steps.pop("unbatched")  # ~3x the cost of ours; keeps --quick under a minute
    grad_diff = gradient_check(module, batch)
    times = bench(steps, args.warmup, args.reps)
    n_params = sum(p.numel() for p in models[0].parameters())
    tokens = sum(int(batch["agents"][i]["attention_mask"].sum()) for i in range(NUM_AGENTS))
    return times, grad_diff, n_params, tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions; skip (d) on the larger model")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: steadier)")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--completion-len", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when a target fails")
    args = parser.parse_args(argv)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.reps = args.reps if args.reps is not None else (5 if args.quick else 11)
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(args.seed)

    t_start = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="madpo_bench_") as tmp:
        tiny_dir = build_tiny_model(Path(tmp) / "tiny")
        large_dir = build_large_model(tiny_dir, Path(tmp) / "large")
        tok = load_tokenizer(tiny_dir)
        for label, path in (("tiny", tiny_dir), ("large", large_dir)):
            results.append((label, *run_model(label, path, tok, args)))

    print(f"\nMADPO step, {NUM_AGENTS} agents, {args.pairs} pairs (prompt ~{args.prompt_len}, completions "
          f"~{args.completion_len} tokens), torch {torch.__version__}, threads={torch.get_num_threads()}, "
          f"warmup={args.warmup}, reps={args.reps}; ms per update of all agents")
    print(f"{'model':<36}{'variant':<13}{'median ms':>10}{'min ms':>9}{'cpu ms':>9}")
    failed = False
    for label, times, grad_diff, n_params, tokens in results:
        desc = f"{label} ({n_params / 1e6:.2f}M params, {tokens} tok)"
        for name, t in times.items():
            wall, best, cpu = (1e3 * f(t[k]) for f, k in ((statistics.median, "wall"), (min, "wall"),
                                                          (statistics.median, "cpu")))
            print(f"{desc:<36}{name:<13}{wall:>10.1f}{best:>9.1f}{cpu:>9.1f}")
            desc = ""
        med = {k: statistics.median(t["wall"]) for k, t in times.items()}
        med_cpu = {k: statistics.median(t["cpu"]) for k, t in times.items()}
        for ratio, (num, den, op, bound) in TARGETS.items():
            if num not in med:
                continue
            r = med[num] / med[den]
            ok = r <= bound if op == "<=" else r >= bound
            failed |= not ok
            print(f"{'':<36}{ratio:<15}{r:>5.2f}x (cpu {med_cpu[num] / med_cpu[den]:.2f}x)  "
                  f"target {op} {bound}x  {'PASS' if ok else 'FAIL'}")
        exp_wall, exp_cpu = (1 + m["no-grad fwd"] / m["ours"] for m in (med, med_cpu))
        print(f"{'':<36}two-pass/ours expected from the parts, 1 + no-grad fwd/ours: {exp_wall:.2f}x "
              f"(cpu {exp_cpu:.2f}x)")
        print(f"{'':<36}grad check: max |ours - detached| = {grad_diff:.2e}")
    print(f"total {time.perf_counter() - t_start:.1f} s")
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
