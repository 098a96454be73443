"""The work-split rules of docs/scaling.md: item blocks per rank, seeds per rank, per-rank checkpoint state,
round metrics reduced with torchmetrics (single process here; tests/trainers/test_ddp.py runs 2 processes)."""

from __future__ import annotations

import json

import pytest

from comlrl_lightning.distributed import (
    RANK_SEED_STRIDE,
    gather_objects,
    gather_round,
    per_rank_entry,
    rank_seed,
    shard_bounds,
)
from comlrl_lightning.metrics import RoundMetrics
from comlrl_lightning.preferences import CollectionStats


@pytest.mark.parametrize("n,world_size", [(8, 2), (3, 2), (1, 2), (0, 3), (7, 3), (2, 5)])
def test_blocks_cover_every_item_once_in_rank_order(n, world_size):
    blocks = [shard_bounds(n, r, world_size) for r in range(world_size)]
    assert [i for s, e in blocks for i in range(s, e)] == list(range(n))
    sizes = [e - s for s, e in blocks]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_more_ranks_than_items_leaves_empty_blocks():
    assert [shard_bounds(1, r, 2) for r in range(2)] == [(0, 1), (1, 1)]


def test_bad_rank_is_an_error_naming_both_values():
    with pytest.raises(ValueError, match="rank=2, world_size=2"):
        shard_bounds(4, 2, 2)


def test_rank_seeds():
    assert rank_seed(7, 0) == 7  # a single process and rank 0 share their seeds
    assert rank_seed(7, 3) - rank_seed(7, 2) == RANK_SEED_STRIDE


def test_one_process_gathers_itself():
    assert gather_objects({"a": 1}, 1) == [{"a": 1}]


def test_resume_with_another_world_size_is_refused():
    assert per_rank_entry(["r0", "r1"], 1, 2, "x") == "r1"
    with pytest.raises(ValueError, match="world size 2 .* this run has world size 1"):
        per_rank_entry(["r0", "r1"], 0, 1, "IterativePreferenceCollection")


def test_round_metrics_weight_each_shard_by_its_counts():
    a = CollectionStats(num_items=2, num_candidates=4, num_pairs=3, reward_sum=2.0, wins=1, comparisons=4, num_ties=1)
    b = CollectionStats(num_items=1, num_candidates=2, num_pairs=1, reward_sum=2.0, wins=2, comparisons=2, num_ties=0)
    m = RoundMetrics()
    for shard in (a, b, CollectionStats()):  # an empty shard changes nothing
        m.update(shard)
    whole = CollectionStats()
    for shard in (a, b):
        whole.add(shard)
    out = m.compute(iterative=True)
    decided = whole.comparisons - whole.num_ties
    assert out == pytest.approx({"round/num_pairs": whole.num_pairs, "round/candidate_reward_mean": whole.reward_mean,
                                 "round/win_rate": whole.wins / decided,
                                 "round/tie_rate": whole.num_ties / whole.comparisons})


def test_round_metrics_without_comparisons_use_the_neutral_values():
    m = RoundMetrics()
    m.update(CollectionStats())
    assert m.compute(iterative=True) == {"round/num_pairs": 0.0, "round/candidate_reward_mean": 0.0,
                                         "round/win_rate": 0.5, "round/tie_rate": 0.0}


def test_collection_state_of_two_ranks_is_refused_by_one_process():
    import random

    from comlrl_lightning.callbacks import IterativePreferenceCollection
    from comlrl_lightning.generation import SamplingStream

    cb = IterativePreferenceCollection()
    cb.streams, cb.rng = [SamplingStream(0)], random.Random(0)
    own = {"streams": [SamplingStream(5).generator.get_state().tolist()], "rng": None}
    with pytest.raises(ValueError, match="world size 2"):
        cb.load_state_dict({"next_round": 1, "rank_states": [own, own]})
    cb.load_state_dict({"next_round": 1, "rank_states": [own]})  # same world size: this rank's streams come back
    assert cb.streams[0].next_seed() == SamplingStream(5).next_seed()


def test_module_state_of_two_ranks_is_refused_by_one_process(tiny_model_dir):
    from comlrl_lightning.config import MAGRPOConfig
    from comlrl_lightning.modules.magrpo import MAGRPOModule

    module = MAGRPOModule(agent_model=tiny_model_dir, args=MAGRPOConfig(num_generations=2))
    state = module.rank_state()
    with pytest.raises(ValueError, match="MAGRPOModule: the checkpoint was written by a run with world size 2"):
        module.on_load_checkpoint({"comlrl_progress": {}, "comlrl_rank_states": [state, state]})


def test_api_comparator_shares_the_concurrency_limit_between_ranks():
    from types import SimpleNamespace

    from comlrl_lightning.comparators.api import APIComparator

    for world_size, share in ((1, 4), (2, 2), (3, 1), (8, 1)):
        comparator = APIComparator(SimpleNamespace(max_concurrency=4))
        for _ in range(2):  # once per fit: the share is taken of the run's limit, not of the last share
            comparator.setup(SimpleNamespace(world_size=world_size), SimpleNamespace(sampling_settings=lambda: None))
        assert comparator.client.max_concurrency == share


def test_one_process_passes_the_round_error_unchanged():
    def work():
        raise KeyError("item 3")

    with pytest.raises(KeyError, match="item 3"):
        gather_round(work, 0, 1, "round 0")
    assert gather_round(lambda: 7, 0, 1, "round 0") == [7]


_FAILING_RANKS = r'''
import datetime, json, os, sys
import torch.distributed as dist
from comlrl_lightning.distributed import RankFailure, gather_round

rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
seen = {"ok": gather_round(lambda: rank * 10, rank, 2, "round 0")}


def raises():
    if rank == 1:
        raise ValueError("bad item 5")
    return rank


try:
    gather_round(raises, rank, 2, "IterativePreferenceCollection round 1")
except RankFailure as exc:
    seen["raised"] = [str(exc), type(exc.__cause__).__name__]
json.dump(seen, open(f"{out}/rank{rank}.json", "w"))


def dies():
    if rank == 1:
        os._exit(3)  # a hard death: this rank never reaches the gather
    return rank


try:
    gather_round(dies, rank, 2, "IterativePreferenceCollection round 2")
except RankFailure as exc:
    seen["died"] = str(exc)
with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump(seen, f)
# Leave without the interpreter's teardown: destroying a gloo group whose peer died can abort the process
# ("terminate called without an active exception", about 1 run in 100 under load), after everything above.
os._exit(0)
'''


def test_a_rank_failing_in_a_round_stops_every_rank_naming_it(tmp_path):
    """2 gloo processes (no Lightning): an exception on rank 1 reaches rank 0 as a RankFailure naming rank 1 and
    the round; a rank whose process exits makes the survivor's gather fail at once, naming the round."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "ranks.py"
    script.write_text(_FAILING_RANKS)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(port), str(tmp_path)], env=env,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 3], "\n".join(e[-2000:] for e in errors)
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    assert rank0["ok"] == [0, 10]
    message, cause = rank0["raised"]
    assert message.startswith("IterativePreferenceCollection round 1 failed on rank 1 of 2 (rank 1: ValueError: "
                              "bad item 5)") and "resume from the last checkpoint" in message
    assert cause == "NoneType"  # rank 0 had no error of its own
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    assert rank1["raised"] == [message, "ValueError"]  # the same message; rank 1 chains its own exception
    assert rank0["died"].startswith("IterativePreferenceCollection round 2: the gather of the ranks' results failed "
                                    "on rank 0")
