"""Round metrics as ``torchmetrics`` metrics, so that a collection split across ranks logs the global values.

Each rank updates the metrics with what its own shard saw; ``compute()`` reduces the states over every rank
of the process group (torchmetrics' own sync: sums of sums and of weights), so no hand-written all-reduce
is needed and a rank with an empty shard contributes nothing. With one process it is plain arithmetic.

* ``round/num_pairs``: sum of the shards' pair counts;
* ``round/candidate_reward_mean``: mean processed reward over every scored joint response
  (``sum r / count``, both summed over ranks);
* ``round/win_rate``: wins of the current side over decided (non-tied) aligned comparisons, 0.5 when none
  was decided; ``round/tie_rate``: ties over aligned comparisons, 0 when there were none.
"""

from __future__ import annotations

import math
from typing import Any

import torch


class RoundMetrics:
    """The metrics of one collection round (offline or iterative), reduced across ranks by torchmetrics.

    Args:
        device: where the metric states live (the module's device: nccl needs CUDA tensors, gloo CPU ones).
    """

    def __init__(self, device: Any = "cpu"):
        from torchmetrics import MeanMetric, SumMetric

        self.num_pairs, self.reward, self.wins, self.ties = (
            m.set_dtype(torch.float64).to(device) for m in (SumMetric(), MeanMetric(), MeanMetric(), MeanMetric()))
        self.device = device

    def update(self, stats: Any) -> None:
        """Add one shard's :class:`~comlrl_lightning.preferences.CollectionStats` (empty shards too)."""

        def t(x: float) -> torch.Tensor:
            return torch.tensor(float(x), dtype=torch.float64, device=self.device)

        decided = stats.comparisons - stats.num_ties
        self.num_pairs.update(t(stats.num_pairs))
        # a MeanMetric weighted by the count: sum(value * weight) / sum(weight) over every rank
        self.reward.update(t(stats.reward_mean), weight=t(stats.num_candidates))
        self.wins.update(t(stats.wins / decided if decided else 0.0), weight=t(decided))
        self.ties.update(t(stats.num_ties / stats.comparisons if stats.comparisons else 0.0),
                         weight=t(stats.comparisons))

    def compute(self, iterative: bool) -> dict[str, float]:
        """The round's global metrics (a collective under DDP: every rank calls it)."""

        def mean_or(metric: Any, default: float) -> float:
            value = float(metric.compute())  # syncs the value and weight sums across ranks
            return value if math.isfinite(value) else default  # 0/0 = NaN: no rank had any weight

        out = {"round/num_pairs": float(self.num_pairs.compute()),
               "round/candidate_reward_mean": mean_or(self.reward, 0.0)}
        if iterative:
            out["round/win_rate"] = mean_or(self.wins, 0.5)
            out["round/tie_rate"] = mean_or(self.ties, 0.0)
        return out


def mean_across_ranks(metrics: dict[str, float], weight: float, world_size: int, device: Any = "cpu",
                      keep: tuple[str, ...] = ()) -> dict[str, float]:
    """Per-rank means (each over ``weight`` samples of this rank) → their weighted mean over every rank,
    ``sum_r w_r·v_r / sum_r w_r``, one ``torchmetrics.MeanMetric`` per key (torchmetrics syncs the sums).

    A collective when ``world_size > 1``: every rank calls it with the same keys (the training steps' log
    gates are equal across ranks). Keys in ``keep`` stay this rank's value. With one rank: ``metrics``.
    """
    if world_size <= 1:
        return dict(metrics)
    from torchmetrics import MeanMetric

    out = {}
    for key, value in metrics.items():
        if key in keep:
            out[key] = value
            continue
        metric = MeanMetric().set_dtype(torch.float64).to(device)
        metric.update(torch.tensor(float(value), dtype=torch.float64, device=device),
                      weight=torch.tensor(float(weight), dtype=torch.float64, device=device))
        out[key] = float(metric.compute())
    return out
