"""The vLLM engine under FSDP2 (docs/scaling.md, "FSDP2"), in an environment with vLLM: a 2-process gloo MAGRPO fit
under ModelParallelStrategy with generation_backend="vllm"; after a sync, each rank's engine serves the gathered
weights. About 50 s per layout here (one engine start per rank). Skipped without vLLM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TESTS = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(TESTS.parent), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def _flat(logprobs) -> list[float]:
    return [v for agent in logprobs for row in agent for completion in row for v in completion]


@pytest.mark.parametrize("layout", ["full", "lora"])
def test_fsdp2_engine_serves_the_gathered_weights_after_a_sync(vllm_model_dir, layout, tmp_path):
    """Full: one agent, one engine per rank; LoRA: 2 adapters on one base. After the first optimizer step, each
    rank's engine (its push gathers the shards) gives the greedy tokens of an HF copy loaded with the gathered whole
    weights, exactly (log-probs within 1e-3: vLLM's CPU kernels are not bit-reproducible), and its log-probs moved
    away from the initial agents'; the agents are DTensors and every engine closed at the end of the fit."""
    out = subprocess.run([sys.executable, str(TESTS / "vllm_fsdp_script.py"), str(tmp_path), vllm_model_dir, layout],
                         capture_output=True, text=True, timeout=600, env=ENV, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    n = 1 if layout == "full" else 2
    for r in (0, 1):
        rec = torch.load(tmp_path / f"rank{r}.pt")
        assert rec["world"] == 2 and rec["global_step"] > 0 and rec["param_type"] == "DTensor"
        assert rec["stale"] == list(range(n)) and rec["changed"]  # the check ran after a step, before any push
        assert rec["served_version"] == rec["requested"] == [1] * n
        assert rec["engine_tokens"] == rec["hf_tokens"]
        engine, hf, initial = (_flat(rec[k]) for k in ("engine_logprobs", "hf_logprobs", "initial_logprobs"))
        assert len(engine) == len(hf) == len(initial) > 0
        assert max(abs(a - b) for a, b in zip(engine, hf)) < 1e-3
        assert max(abs(a - b) for a, b in zip(engine, initial)) > 1e-2  # the served weights are the trained ones
        # the check's push gathered the changed parts (full: the model; LoRA: each adapter), on this rank too
        assert len(rec["gathers_after"]) - len(rec["gathers_before"]) == n
        assert not rec["started"]
