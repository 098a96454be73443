"""The vLLM engine under FSDP2 (docs/scaling.md, "FSDP2"), vLLM replaced at its boundary (no vLLM needed): every push
gathers the sharded weights (full agents) or adapters (LoRA) on every rank, and the weights pushed equal the ones the
strategy="ddp" fit of the same seed pushes; a rank with nothing to generate joins the others' gathers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": str(TESTS.parent), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
FULL = ["agent 0 start", "agent 1 start", "agent 0 reload", "agent 1 reload"]
PUSHES = {"magrpo": FULL, "madpo_one": FULL,
          "magrpo_lora": ["LoRA agents (one base) start", "adapter 0", "adapter 1", "adapter 0", "adapter 1"]}


@pytest.mark.slow
def test_fsdp2_vllm_pushes_gathered_weights_equal_to_ddp(tiny_model_dir, tmp_path):
    """On 2 gloo processes, MAGRPO with 2 full agents, MAGRPO with 2 LoRA agents and MADPOIter on 1 item (2 rounds;
    rank 1 collects nothing) with generation_backend="vllm": under ModelParallelStrategy the engine starts from and
    reloads the gathered whole weights (LoRA: the gathered base, then each adapter), bit-equal to what the ddp fit
    pushes, one gather per push on every rank, and the reloads carry trained weights."""
    out = subprocess.run([sys.executable, str(TESTS / "fsdp_vllm_push_script.py"), str(tmp_path), tiny_model_dir,
                          *PUSHES], capture_output=True, text=True, timeout=900, env=ENV, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for name, labels in PUSHES.items():
        for r in (0, 1):
            ddp, fsdp = ranks[r][f"{name}/ddp"], ranks[r][f"{name}/fsdp2"]
            assert fsdp["sharded"] and not ddp["sharded"] and ddp["gathers"] == []
            assert fsdp["global_step"] == ddp["global_step"] > 0
            pushed = labels if r == 0 or name != "madpo_one" else []  # rank 1 of madpo_one never generates
            assert [label for label, _ in fsdp["pushed"]] == [label for label, _ in ddp["pushed"]] == pushed, name
            # one gather per push (the LoRA base once), on the rank that generates nothing too
            assert len(fsdp["gathers"]) == len(labels), (name, r, fsdp["gathers"])
            assert all(seconds > 0 and size > 0 for seconds, size in fsdp["gathers"])
            for (label, a), (_, b) in zip(ddp["pushed"], fsdp["pushed"]):
                assert a.keys() == b.keys() and a, (name, label)
                for k in a:
                    assert torch.equal(a[k], b[k]), (name, label, k)
            n = len(pushed)
            for later, earlier in ((n - 2, n - 4), (n - 1, n - 3)) if pushed else ():  # each agent's 2nd push
                state, before = fsdp["pushed"][later][1], fsdp["pushed"][earlier][1]  # differs: trained weights
                assert any(not torch.equal(state[k], before[k]) for k in state), (name, later)


def test_a_backend_without_sharded_weights_is_refused_under_fsdp2():
    """An engine that cannot gather sharded weights is refused at configure_model, naming the backend and the
    supported ones."""
    from types import SimpleNamespace

    from lightning.pytorch.strategies import ModelParallelStrategy

    from comlrl_lightning.sharding import shard_team

    module = SimpleNamespace(reference=None, team=SimpleNamespace(engine=object()),
                             _trainer=SimpleNamespace(strategy=ModelParallelStrategy()),
                             args=SimpleNamespace(parallel_training="none", generation_backend="other"))
    with pytest.raises(ValueError, match=r"generation_backend='other' with ModelParallelStrategy .*='hf' or 'vllm'"):
        shard_team(module)
