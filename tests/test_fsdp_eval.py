"""Evaluation under FSDP2 (docs/scaling.md, "FSDP2"): every rank evaluates the same items, its sharded generate calls
(and actor-critic critic and KL passes) are balanced collectives, so a rank whose evaluation makes fewer calls joins
the others' instead of leaving them waiting; the metrics are those of strategy="ddp" from the same seed."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": str(TESTS.parent), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled",
       "FSDP_SCRIPT_DUMP": "420"}  # a hang prints the stacks and fails before the launcher's timeout
REPLICATED = ("magrpo", "magrpo_turns", "iac_turns", "madpo_iter")
UNEVEN = ("iac_uneven", "maac_uneven")


@pytest.mark.slow
def test_fsdp2_evaluation_with_uneven_calls_ends_and_equals_ddp(tiny_model_dir, tmp_path):
    """On 2 gloo processes, fits that evaluate 3 eval items (2 + 1 per generate call) before every update and at the
    end, under strategy="ddp" then ModelParallelStrategy() from the same seed: single-turn MAGRPO (then validate),
    2-turn MAGRPO, 2-turn IAC with early termination, MADPOIter (2 rounds); and 2-turn IAC (reference KL on) and MAAC
    whose task reward ends rank 0's evaluation episodes after turn 1 while rank 1's run 2 turns, so rank 1 makes twice
    the generate, critic and KL calls. Every evaluation ends, each rank's metrics equal ddp's on that rank (and are
    the same on both ranks where the reward is), and the agents train to ddp's weights."""
    out = subprocess.run([sys.executable, str(TESTS / "fsdp_eval_script.py"), str(tmp_path), tiny_model_dir,
                          *REPLICATED, *UNEVEN], capture_output=True, text=True, timeout=600, env=ENV, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for name in REPLICATED + UNEVEN:
        for r in (0, 1):
            ddp, fsdp = ranks[r][f"{name}/ddp"], ranks[r][f"{name}/fsdp2"]
            assert fsdp["world"] == 2 and fsdp["global_step"] == ddp["global_step"] > 0, (name, r)
            assert len(fsdp["history"]) >= 2 and fsdp["history"] == ddp["history"], (name, r)
            assert ddp["announced"] == [] and len(fsdp["announced"]) > 0, (name, r)
            for a, b in zip(ddp["weights"], fsdp["weights"]):
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=f"{name}: FSDP2 differs from ddp")
    for name in REPLICATED:  # replicated: the same items, seeds and calls on every rank
        assert ranks[0][f"{name}/fsdp2"]["history"] == ranks[1][f"{name}/fsdp2"]["history"], name
        assert len(ranks[0][f"{name}/fsdp2"]["announced"]) == len(ranks[1][f"{name}/fsdp2"]["announced"]), name
    iac = [m for _, m in ranks[0]["iac_turns/fsdp2"]["history"]]
    assert all("eval/turn_2/reward_mean" in m for m in iac)  # early termination ended some episodes, not all
    magrpo = [ranks[r]["magrpo/fsdp2"] for r in (0, 1)]
    assert magrpo[0]["validate"] == magrpo[1]["validate"] == ranks[0]["magrpo/ddp"]["validate"]
    final = magrpo[0]["history"][-1][1]["eval/reward_mean"]  # validate logs float32
    assert magrpo[0]["validate"]["val/reward_mean"] == pytest.approx(final, rel=1e-6)
    assert len(magrpo[0]["validate_announced"]) == len(magrpo[1]["validate_announced"]) > 0
    for name in UNEVEN:  # rank 0: every episode ended after turn 1; rank 1: 2 turns, twice the calls
        first, second = ranks[0][f"{name}/fsdp2"], ranks[1][f"{name}/fsdp2"]
        assert all(m["eval/turn_1/reward_mean"] == 10.0 and "eval/turn_2/reward_mean" not in m
                   for _, m in first["history"]), name
        assert all("eval/turn_2/reward_mean" in m for _, m in second["history"]), name
        assert len(second["announced"]) == 2 * len(first["announced"]), name
    assert "eval/turn_1/reference_kl_mean" in ranks[1]["iac_uneven/fsdp2"]["history"][-1][1]


@pytest.mark.slow
def test_fsdp2_evaluation_error_on_one_rank_stops_every_rank(tiny_model_dir, tmp_path):
    """The task reward raises during evaluation on rank 1 only: rank 0 does not wait for it in a collective, both
    ranks stop with a RankFailure naming rank 1, the evaluated update and the error."""
    out = subprocess.run([sys.executable, str(TESTS / "fsdp_eval_script.py"), str(tmp_path), tiny_model_dir,
                          "magrpo_fail"], capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path)
    assert out.returncode != 0
    message = "RankFailure: Evaluation at update 0 failed on rank 1 of 2 (rank 1: RewardError"
    assert out.stderr.count(message) >= 2 and "the judge is unreachable" in out.stderr, out.stderr[-3000:]


def test_out_of_step_collectives_are_named(monkeypatch):
    """Ranks announcing different balanced collectives at the same point: the error names both, whatever they are
    (a name given at registration, else one read from the join: its function and the class it refers to)."""
    import comlrl_lightning.distributed as distributed

    def join_generate(ref):
        pass

    model = torch.nn.Linear(2, 2)
    generate = distributed.register_balanced(functools.partial(join_generate, weakref.ref(model)))
    push = distributed.register_balanced(lambda: None, name="vLLM push of agent 1's weights")
    try:
        monkeypatch.setattr(distributed, "world", lambda trainer=None: (0, 2))
        monkeypatch.setattr(distributed, "_exchange", lambda key: [key, push])
        with pytest.raises(RuntimeError, match=rf"this rank: #{generate} join_generate\(Linear\); other ranks: "
                                               rf"#{push} vLLM push of agent 1's weights\): the ranks' balanced"):
            distributed.announce_balanced(generate)
        monkeypatch.setattr(distributed, "_exchange", lambda key: [generate, push])
        with pytest.raises(RuntimeError, match=rf"#{generate} join_generate\(Linear\), #{push} vLLM push"):
            distributed.join_balanced()
    finally:  # leave the registry as the other tests found it
        for key in (generate, push):
            distributed._BALANCED.pop(key)
            distributed._NAMES.pop(key)
