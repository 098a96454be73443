"""DDP on CPU (gloo, 2 processes): collection is split across ranks, gathered, and the replicas end identical.

Run as subprocesses: under pytest, strategy="ddp" would re-run the whole pytest command in rank 1. The scripts
record, per rank, what its own shard produced and what the data module received (docs/scaling.md).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/ (the DDP scripts live there)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def _run(script: str, tmp_path: Path, *args: str) -> list[dict]:
    out = subprocess.run([sys.executable, str(HERE / script), str(tmp_path), *args], capture_output=True, text=True,
                         timeout=600, env=_env(), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def _run_two_nodes(script: str, tmp_path: Path, *args: str, extra_env: dict | None = None) -> list[dict]:
    """2 nodes x 1 process on 127.0.0.1: the environment torchrun or SLURM gives each node, Lightning's own path."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs, logs = [], [tmp_path / f"node{node}.log" for node in (0, 1)]
    for node in (0, 1):  # stderr to files: a full pipe not being read would block its node inside a collective
        env = {**_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": str(node),
               "LOCAL_RANK": "0", "WORLD_SIZE": "2", "DDP_TEST_NODES": "2", **(extra_env or {})}
        with open(logs[node], "w") as log:
            procs.append(subprocess.Popen([sys.executable, str(HERE / script), str(tmp_path), *args], env=env,
                                          cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=log))
    try:
        for p in procs:
            p.wait(timeout=600)
    finally:
        for p in procs:  # a node left waiting on a failed one would outlive the test
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log.read_text()[-2000:] for log in logs)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


TOPICS = ("rivers", "bread", "trains")  # the script's first items


def _check_round(ranks: list[dict], round_index: int, shards: list[list[int]]) -> list[dict]:
    """The round's gathered pairs are the concatenation of the shards' own pairs (rank order), identical on
    both ranks; the shards are the contiguous blocks [0, 2) and [2, 3) of the 3 items, each pair from its block."""
    local = [r["local"][round_index] for r in ranks]
    assert [(s["start"], s["end"]) for s in local] == [(0, 2), (2, 3)]
    assert shards == [[s["start"], s["end"], len(s["pairs"])] for s in local]
    gathered = ranks[0]["gathered"][round_index]
    assert ranks[1]["gathered"][round_index] == gathered
    assert gathered == local[0]["pairs"] + local[1]["pairs"]  # no loss, no duplicate, dataset order
    for s in local:
        topics = TOPICS[s["start"]:s["end"]]
        assert all(any(t in p["prompts"][0] for t in topics) for p in s["pairs"])
    return gathered


def _check_logged(ranks: list[dict], local: tuple[str, ...] = ("env_step",)) -> None:
    """Logged means are reduced over both ranks (torchmetrics), so both ranks hold the same values (rank 0 logs
    them), though the ranks trained on different pairs or prompts; round metrics describe the gathered round."""
    a, b = ([{k: v for k, v in m.items() if k not in local} for m in r["logged"]] for r in ranks)
    assert len(a) == len(b) > 0
    assert all(x == pytest.approx(y, rel=1e-9, abs=1e-12) for x, y in zip(a, b))
    rounds = [m["round/num_pairs"] for m in a if "round/num_pairs" in m]
    assert rounds == [len(g) for g in ranks[0].get("gathered", [])]


@pytest.mark.slow
def test_madpo_collection_is_split_and_gathered(tiny_model_dir, tmp_path):
    ranks = _run("ddp_rounds_script.py", tmp_path, tiny_model_dir, "madpo", "3")  # 3 items: uneven shards 2 + 1
    assert [f["world"] for r in ranks for f in r["fits"]] == [2, 2]
    _check_round(ranks, 0, ranks[0]["shards"])
    assert ranks[1]["shards"] == ranks[0]["shards"]
    # the two ranks sampled with different seeds: their shards are not copies of each other
    assert ranks[0]["local"][0]["pairs"] != ranks[1]["local"][0]["pairs"]
    # gradients are averaged across ranks, so both replicas end with the same weights
    a, b = (r["fits"][0] for r in ranks)
    assert a["global_step"] == b["global_step"] > 0
    assert a["sums"] == pytest.approx(b["sums"], rel=0, abs=1e-9)
    assert ranks[0]["writes"] == ranks[1]["writes"] == []  # offline MADPO writes no round file
    _check_logged(ranks)


@pytest.mark.slow
def test_madpo_iter_two_nodes_split_rank0_writes_resume_and_rank_failure(tiny_model_dir, tmp_path):
    # the same launch then runs the fit again with rank 1 raising in round 2, and resumes it (docs/scaling.md §5)
    ranks = _run_two_nodes("ddp_rounds_script.py", tmp_path, tiny_model_dir, "iter", "3",
                           extra_env={"DDP_TEST_FAIL": "1:2:raise"})
    # 3 rounds in the full fit; round 2 again in the fit resumed from the checkpoint of epoch 0 (written after
    # round 1 was collected at that epoch's end)
    assert [len(r["local"]) for r in ranks] == [4, 4]
    files = ranks[0]["round_files"]
    for t in range(3):
        gathered = _check_round(ranks, t, ranks[0]["shards"][t])
        assert files[f"iteration_{t + 1:04d}.json"]["pairs"] == gathered  # each pair exactly once
    # rank 0 alone writes the round files (3 rounds, then round 3 again after the resume)
    assert ranks[0]["writes"] == [f"iteration_{i:04d}.json" for i in (1, 2, 3, 3)]
    assert ranks[1]["writes"] == []
    # the resumed fit collects round 2 exactly as the uninterrupted one: each rank's streams came back
    for r in ranks:
        assert r["local"][3] == r["local"][2] and r["gathered"][3] == r["gathered"][2]
    assert ranks[0]["resumed_round_files"] == files
    _check_logged(ranks)
    full, resumed, recovered = ranks[0]["fits"]
    assert resumed["pairs"] == full["pairs"]
    assert resumed["sums"] == pytest.approx(full["sums"], rel=0, abs=1e-9)
    for fit in ranks[1]["fits"]:  # rank 1's replica equals rank 0's, in every fit
        assert fit["sums"] == pytest.approx(full["sums"], rel=0, abs=1e-9)
    # rank 1 raised in round 2: both ranks stopped there with an error naming the rank and the round
    for r in ranks:
        assert r["failure"].startswith("RankFailure: IterativePreferenceCollection round 2 failed on rank 1 of 2")
        assert "injected failure on rank 1" in r["failure"]
    # nothing of round 2 was written; rounds 0 and 1 are the uninterrupted run's; the last checkpoint is epoch 0's
    assert ranks[0]["failed_round_files"] == {k: files[k] for k in ("iteration_0001.json", "iteration_0002.json")}
    assert ranks[0]["failed_checkpoints"] == ["round-epoch=0.ckpt"]
    # resumed from it: every round file holds each pair exactly once, as in the uninterrupted run, same weights
    assert ranks[0]["recovered_round_files"] == files
    assert recovered["pairs"] == full["pairs"]
    assert recovered["sums"] == pytest.approx(full["sums"], rel=0, abs=1e-9)


@pytest.mark.slow
def test_magrpo_prompts_are_sharded_and_groups_stay_on_one_rank(tiny_model_dir, tmp_path):
    ranks = _run("ddp_magrpo_script.py", tmp_path, tiny_model_dir)
    assert [r["world"] for r in ranks] == [2, 2]
    seen = [{g[0] for g in r["groups"]} for r in ranks]
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == {0, 1, 2, 3}  # DistributedSampler: 2 prompts each
    for r in ranks:
        for index in {g[0] for g in r["groups"]}:
            mine = [g for g in r["groups"] if g[0] == index]
            # the whole 2-turn tree of a prompt (root + 2 children, 2 agents) was built and scored on this rank,
            # every node's sibling group (K = 2 completions) with its own advantages
            assert len(mine) == 6 and all(g[3] == 2 == len(g[4]) for g in mine)
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    assert ranks[0]["sums"] == pytest.approx(ranks[1]["sums"], rel=0, abs=1e-9)
    _check_logged(ranks, local=("env_step",))


@pytest.mark.slow
def test_marlhf_marlhf_iter_iac_maac_split_gathered_and_replicas_identical(tiny_model_dir, tmp_path):
    """One launch, four fits in the same 2 processes (docs/scaling.md §1): MARLHF and MARLHFIter split their
    collections and fit the same reward model on every rank; IAC and MAAC split the prompts."""
    ranks = _run("ddp_families_script.py", tmp_path, tiny_model_dir)
    fits = [{f["name"]: f for f in r["fits"]} for r in ranks]
    assert list(fits[0]) == list(fits[1]) == ["marlhf", "marlhf_iter", "iac", "maac"]
    for name in fits[0]:
        a, b = fits[0][name], fits[1][name]
        assert a["world"] == b["world"] == 2 and a["global_step"] == b["global_step"] > 0
        # replicas identical after training: actors and (IAC, MAAC) critics
        assert a["actors"] == pytest.approx(b["actors"], rel=0, abs=1e-9)
        assert a["critics"] == pytest.approx(b["critics"], rel=0, abs=1e-9)
    for name, rounds in (("marlhf", 1), ("marlhf_iter", 2)):
        a, b = fits[0][name], fits[1][name]
        assert len(a["local"]) == len(b["local"]) == len(a["reward_fits"]) == len(b["reward_fits"]) == rounds
        for t in range(rounds):
            (s0, e0, own0), (s1, e1, own1) = a["local"][t], b["local"][t]
            assert (s0, e0, s1, e1) == (0, 2, 2, 4) and own0 and own1 and own0 != own1
            # every rank's reward model was fitted on the gathered pairs (no loss, no duplicate, dataset order),
            # with the same seed: the same model on both ranks
            assert a["reward_fits"][t]["pairs"] == b["reward_fits"][t]["pairs"] == own0 + own1
            assert a["reward_fits"][t]["sum"] == pytest.approx(b["reward_fits"][t]["sum"], rel=0, abs=1e-9)
        # the RL stage (MAGRPO) and the round metrics are reduced over both ranks
        _check_logged([{**f, "gathered": [fit["pairs"] for fit in f["reward_fits"]]} for f in (a, b)])
    for name in ("iac", "maac"):
        a, b = fits[0][name], fits[1][name]
        assert a["critics"] and not a["local"]
        # DistributedSampler: each rank rolled out 2 of the 4 prompts, its own (2 agents x 2 generations each)
        items = [{s[0] for s in f["samples"]} for f in (a, b)]
        assert items[0].isdisjoint(items[1]) and items[0] | items[1] == {0, 1, 2, 3}
        assert len(a["samples"]) == len(b["samples"]) == 2 * 2 * 2
        assert [s[1:] for s in a["samples"]] != [s[1:] for s in b["samples"]]  # different prompts and streams
