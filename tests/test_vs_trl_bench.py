"""benchmarks/vs_trl.py without trl: its arguments, its report helpers, the floor job and our side of the job on
the tiny model. The TRL side needs trl (only in .venv-bench) and is skipped without it."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "vs_trl.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("vs_trl_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves annotations through sys.modules
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_arguments(bench):
    args = bench.parse_args([])
    assert (args.model, args.reps, args.threads, args.libs, args.prompts, args.epochs, args.ours_overrides) == (
        "30m", 2, 1, ["ours", "trl", "floor"], 24, 2, {})
    job = bench.job_of(args)
    assert (job.prompts, job.generations, job.new_tokens, job.prompts_per_step, job.epochs, job.lr, job.steps) == (
        24, 4, 12, 2, 2, 2e-3, 24)
    assert len({it["prompt"] for it in job.items()}) == 24
    args = bench.parse_args(["--model", "tiny", "--reps", "1", "--threads", "2", "--libs", "ours", "floor",
                             "--ours", "agent_overlap=off", "--ours", "logging_steps=5"])
    assert (args.model, args.reps, args.threads, args.libs) == ("tiny", 1, 2, ["ours", "floor"])
    assert args.ours_overrides == {"agent_overlap": "off", "logging_steps": 5}
    for bad in (["--reps", "0"], ["--threads", "0"], ["--prompts", "3"], ["--model", "7b"], ["--libs", "comlrl"],
                ["--ours", "novalue"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_reward_and_report_helpers(bench):
    assert bench.vowel_share(["aeiou", "xyz", "", "ab"], prompts=["p"] * 4) == [1.0, 0.0, 0.0, 0.5]
    assert bench.ratio(3.0, 2.0) == 1.5 and bench.ratio(1.0, 0.0) == float("inf")
    assert bench.verdict(1.2, ">=", 1.2) == "target >= 1.2x  PASS"
    assert bench.verdict(1.06, "<=", 1.05) == "target <= 1.05x  FAIL"
    counts = {"opt_steps": 24, "gen_calls": 24, "samples": 192, "fwd_calls": 24, "fwd_tokens": 100, "gen_s": 1.0}
    runs = [{"lib": lib, "wall": w, "cpu": w / 2, "peak_rss_mb": rss, "delta": d, "before": 0.2, "after": 0.2 + d,
             "load": 1.0, "counts": counts}
            for lib, w, rss, d in (("ours", 10.0, 1000, 0.5), ("ours", 12.0, 1000, 0.5), ("trl", 15.0, 990, 0.52),
                                   ("floor", 9.0, 800, 0.4))]
    summary = bench.summarize(runs)
    assert summary["ours"]["wall"] == 11.0 and summary["ours"]["n"] == 2
    lines, ok = bench.ratio_lines(summary, "30m")
    text = "\n".join(lines)
    assert "TRL/ours time (our speed-up): 1.36x (cpu 1.36x)  target >= 1x  PASS" in text
    assert "ours/TRL peak RSS: 1.01x (1000 / 990 MB)  target <= 1.05x  PASS" in text
    assert "|difference| 0.020  target <= 0.05  PASS" in text
    assert "ours/floor time: 1.22x (cpu 1.22x)  target <= 1.2x  FAIL" in text and not ok
    assert bench.run_line(runs[0]).split()[:4] == ["ours", "10.00", "5.00", "24"]


def test_missing_trl_says_how_to_install_and_exits_2(bench, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    assert bench.trl_version() is None
    assert bench.main(["--model", "tiny"]) == 2
    assert "make_bench_env.sh" in capsys.readouterr().err


def test_floor_job_one_step_and_a_repeatable_evaluation(bench, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    job = bench.Job(prompts=2, epochs=1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [it["prompt"] for it in job.items()]
    before = bench.evaluate(model, tok, prompts)
    assert 0.0 <= before <= 1.0 and bench.evaluate(model, tok, prompts) == before  # fixed evaluation streams
    weights = [p.detach().clone() for p in model.parameters()]
    wall, cpu, counts = bench.timed(bench.floor_run(job, model, tok), model)
    assert job.steps == 1
    assert {k: counts[k] for k in ("opt_steps", "gen_calls", "samples", "fwd_calls", "fwd_rows")} == {
        "opt_steps": 1, "gen_calls": 1, "samples": 8, "fwd_calls": 1, "fwd_rows": 8}
    changed = [not torch.equal(w, p) for w, p in zip(weights, model.parameters())]
    assert statistics.fmean(changed) > 0.5  # the step moved the weights (tied embeddings count once)


def test_ours_takes_two_prompts_per_optimizer_step(bench, tiny_model_dir, tmp_path):
    job = bench.Job(prompts=4, epochs=1)
    tr = bench.ours_trainer(job, tiny_model_dir, str(tmp_path))
    assert (tr.args.num_agents, tr.args.num_generations, tr.args.rollout_buffer_size, tr.args.train_batch_size,
            tr.args.reference_kl_enabled) == (1, 4, 2, 2, False)
    wall, cpu, counts = bench.timed(tr.train, tr.team.models[0])
    assert counts["opt_steps"] == job.steps == 2
    assert counts["samples"] == 16 and counts["fwd_rows"] == 16


def test_trl_config_matches_the_job(bench, tiny_model_dir, tmp_path):
    pytest.importorskip("trl", reason="trl is only in the benchmark environment (bash benchmarks/make_bench_env.sh)")
    tr = bench.trl_trainer(bench.Job(), tiny_model_dir, str(tmp_path))
    a = tr.args
    assert (a.generation_batch_size, a.steps_per_generation, a.num_generations, a.per_device_train_batch_size,
            a.max_completion_length, a.beta, a.learning_rate, a.num_train_epochs) == (8, 1, 4, 8, 12, 0.0, 2e-3, 2)
    assert (a.bf16, a.gradient_checkpointing, a.use_vllm, a.max_grad_norm) == (False, False, False, 0.0)
