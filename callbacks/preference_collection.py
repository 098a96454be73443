"""PreferenceCollection: sample the current agents on the task items, score, and hand pairs to the data.

Offline MADPO collects once, at fit start (before Lightning builds the first train dataloader). The
callback talks to the LightningModule through the ``TeamModule`` protocol and to the DataModule through
``PairSink`` (task items, formatters, oracle and ``add_round(pairs)``; see :mod:`comlrl_lightning.protocols`).

Under a multi-process strategy (world size W) each rank samples, scores and selects the pairs of its own
contiguous block of the task items with seeds derived from (seed, rank); the blocks' pairs are gathered in
rank order, so every rank hands the same global pair list, in dataset order, to the data module
(docs/scaling.md). ``shards`` records, per rank, ``[start, end, num_pairs]``.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from comlrl_lightning.config.madpo import refuse_centralized_learner
from comlrl_lightning.distributed import world
from comlrl_lightning.logging_utils import log_metrics
from comlrl_lightning.metrics import RoundMetrics
from comlrl_lightning.preferences import collect_offline_split
from comlrl_lightning.protocols import PairSink, TeamModule, check_protocol


class PreferenceCollection(L.Callback):
    """Collect offline preference pairs once at fit start.

    Args:
        seed: seed of the agents' sampling streams (agent i uses ``s + 1000 * i``) and of random pair
            selection (``s``), where ``s = rank_seed(seed, rank)`` (``seed`` itself on rank 0 and in a single
            process). None = the module's ``args.seed``.
        chunk_size: task items generated together per agent.
    """

    def __init__(self, seed: int | None = None, chunk_size: int = 16):
        self.seed = seed
        self.chunk_size = chunk_size
        self.collected = False
        self.last_stats = None
        self.shards: list[list[int]] = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_protocol(pl_module, TeamModule, "PreferenceCollection", "module", "MADPOModule")
        check_protocol(trainer.datamodule, PairSink, "PreferenceCollection", "data module", "PreferenceDataModule")
        refuse_centralized_learner(pl_module.args, "PreferenceCollection")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.collected:  # restored from a checkpoint: the pairs came back with the data module state
            return
        args = pl_module.args
        rank, world_size = world(trainer)
        dm = trainer.datamodule
        pairs, stats, local_stats, self.shards = collect_offline_split(
            pl_module.team, list(dm.train_items), dm.formatters, dm.oracle, pl_module.sampling_settings(),
            args.preference_num_candidates, args.pair_selection, args.preference_pairs_per_sample,
            args.seed if self.seed is None else self.seed, rank, world_size, chunk_size=self.chunk_size,
            progress=trainer.is_global_zero and trainer.progress_bar_callback is not None,
            where="PreferenceCollection (the offline collection)",
        )
        metrics = RoundMetrics(pl_module.device)
        metrics.update(local_stats)
        self.collected = True
        self.last_stats = stats
        dm.add_round(pairs)
        log_metrics(trainer, {**metrics.compute(iterative=False), "round/index": 0})
        rank_zero_info(f"Collected {stats.num_pairs} preference pairs from {stats.num_items} task items "
                       f"({stats.num_candidates} joint responses, mean task reward {stats.reward_mean:.4f}).")
        if not pairs:
            rank_zero_warn(f"MADPO: no non-tied preference pairs were generated from {stats.num_items} items "
                           f"({stats.num_candidates} joint responses, mean reward {stats.reward_mean:.4f}); the "
                           "policies are not updated. Every candidate of every item got the same reward: a "
                           "constant or saturated reward_func/reward_processor gives no preference. Check it on a "
                           "few completions, or sample more diverse candidates (temperature, "
                           "preference_num_candidates).")
            trainer.should_stop = True

    def state_dict(self) -> dict:
        return {"collected": self.collected, "shards": [list(s) for s in self.shards]}

    def load_state_dict(self, state_dict: dict) -> None:
        self.collected = bool(state_dict.get("collected", False))
        self.shards = [list(s) for s in state_dict.get("shards", [])]
