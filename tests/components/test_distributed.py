"""The work-split rules of docs/scaling.md: item blocks per rank, seeds per rank, per-rank checkpoint state,
round metrics reduced with torchmetrics (single process here; tests/trainers/test_ddp.py runs 2 processes)."""

from __future__ import annotations

import pytest

from comlrl_lightning.distributed import (
    RANK_SEED_STRIDE,
    gather_objects,
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
            comparator.setup(SimpleNamespace(world_size=world_size), None)
        assert comparator.client.max_concurrency == share
