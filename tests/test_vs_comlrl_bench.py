"""benchmarks/vs_comlrl.py without comlrl: its arguments, the message when comlrl is missing, its work counters."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "vs_comlrl.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("vs_comlrl_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arguments(bench):
    args = bench.parse_args([])
    assert (args.jobs, args.repeats, args.threads, args.rollout_buffer_size, args.learning, args.model) == (
        ["madpo", "magrpo2"], 2, 1, None, False, "tiny")
    args = bench.parse_args(["--jobs", "magrpo2", "--repeats", "3", "--rollout-buffer-size", "10", "--learning",
                             "--model", "30m"])
    assert (args.jobs, args.repeats, args.rollout_buffer_size, args.learning, args.model) == (
        ["magrpo2"], 3, 10, True, "30m")
    args = bench.parse_args(["--jobs", "magrpo1", "--seeds", "0", "1", "2", "3", "--learning"])
    assert (args.jobs, args.seeds) == (["magrpo1"], [0, 1, 2, 3])
    assert bench.parse_args(["--seed", "5"]).seeds == [5]
    for bad in (["--repeats", "0"], ["--jobs", "marlhf"], ["--rollout-buffer-size", "0"], ["--model", "7b"],
                ["--threads", "0"], ["--comlrl-threads", "0"], ["--agent-overlap", "maybe"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_each_library_gets_its_best_settings_unless_told(bench):
    args = bench.parse_args(["--model", "30m"])  # the whole machine: CoMLRL every core, ours a worker per agent
    assert (args.comlrl_threads, args.threads, args.agent_overlap) == (os.cpu_count() or 1, 1, "on")
    assert bench.judged_on(args) == "wall"  # more than one thread in use: CPU seconds are not time to result
    args = bench.parse_args([])  # tiny: Python-bound, one thread each is the best of both
    assert (args.comlrl_threads, args.threads, args.agent_overlap) == (1, 1, "off")
    assert bench.judged_on(args) == "cpu"
    args = bench.parse_args(["--comlrl-threads", "2", "--agent-overlap", "on"])
    assert (args.comlrl_threads, args.agent_overlap, bench.judged_on(args)) == (2, "on", "wall")
    assert bench.TARGETS[("magrpo2", "30m")] == 2.5 and bench.TARGETS[("magrpo2", "tiny")] == 3.0


def test_missing_comlrl_says_how_to_install_and_exits_2(bench, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "comlrl" else real(name, *a))
    assert bench.comlrl_version() is None
    assert bench.main(["--jobs", "madpo"]) == 2
    err = capsys.readouterr().err
    assert "comlrl==1.4.3" in err and '-e ".[dev,bench]"' in err


def test_counters_see_generate_scoring_forwards_and_optimizer_steps(bench, tiny_model_dir):
    from transformers import AutoModelForCausalLM, Qwen2ForCausalLM
    from transformers.generation.utils import GenerationMixin

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.tensor([[5, 6, 7]])
    originals = (GenerationMixin.generate, Qwen2ForCausalLM.forward)

    def work():
        model.generate(input_ids=ids, do_sample=True, num_return_sequences=3, max_new_tokens=4, min_new_tokens=4,
                       pad_token_id=0)
        model(input_ids=torch.ones(2, 5, dtype=torch.long)).logits.sum().backward()
        opt.step()

    wall, cpu, counts = bench.timed(work)
    assert {k: counts[k] for k in ("gen_calls", "samples", "fwd_calls", "fwd_rows", "fwd_tokens", "opt_steps")} == {
        "gen_calls": 1, "samples": 3, "fwd_calls": 1, "fwd_rows": 2, "fwd_tokens": 10, "opt_steps": 1}
    assert 0 < counts["gen_s"] <= wall and cpu > 0
    assert (GenerationMixin.generate, Qwen2ForCausalLM.forward) == originals  # patches removed
    opt.step()
    assert bench.timed(lambda: None)[2]["opt_steps"] == 0  # the step hook is gone too


def test_learning_over_seeds_is_judged_on_the_mean_gain(bench, capsys):
    def seed(before, ours, comlrl):
        return {"before": before, "ours": ours, "comlrl": comlrl}

    close = {0: seed(0.5, 1.0, 1.02), 1: seed(0.5, 0.98, 0.97)}  # means +0.490 vs +0.495: within 0.01
    assert bench.learning_lines("magrpo1", close)
    out = capsys.readouterr().out
    assert "seed 1:" in out and "mean gain over 2 seeds: ours +0.490, CoMLRL +0.495" in out and "PASS" in out
    behind = {0: seed(0.5, 0.9, 1.0), 1: seed(0.5, 1.0, 1.0)}  # +0.450 vs +0.500
    assert not bench.learning_lines("magrpo1", behind)
    assert "FAIL" in capsys.readouterr().out
    assert bench.learning_lines("magrpo1", {0: seed(0.5, 0.6, 1.0)})  # one seed: printed, not judged
