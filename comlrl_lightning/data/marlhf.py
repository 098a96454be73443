"""MARLHFIterDataModule: task items for the RL stage plus the round pairs and replay buffer of MARLHFIter.

It is an :class:`~comlrl_lightning.data.madpo.IterativePreferenceDataModule` (the pair sink
``add_round``, ``commit_round``, the replay store and its checkpoint state) whose train dataloader serves
the **task items** (one ``[(index, item)]`` batch per step, as
:class:`~comlrl_lightning.data.task.TaskDataModule`), because MARLHF's policies learn by RL on the
task prompts; the round's replay-selected pairs (``pairs``) train the reward model instead
(:class:`~comlrl_lightning.callbacks.IterativeRewardModelFit`).

``preference_oracle``: the oracle that scores the next round's comparisons when set (MARLHFIter with
``preference_scoring_reward="reward_model"``); None = the task reward ``oracle``. Evaluation always reads
``oracle``.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from comlrl_lightning.data.madpo import IterativePreferenceDataModule
from comlrl_lightning.data.task import task_loader


class MARLHFIterDataModule(IterativePreferenceDataModule):
    """Task items for RL + round pairs for the reward model.

    Args:
        external_transition: must stay None (MARLHF is single-turn); kept for the RL modules' interface.
        shuffle: shuffle the task items every epoch (upstream: dataset order).
        **kwargs: as :class:`~comlrl_lightning.data.madpo.IterativePreferenceDataModule`.
    """

    def __init__(self, *args: Any, shuffle: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.external_transition = None
        self.shuffle = shuffle

    def train_dataloader(self) -> DataLoader:
        return task_loader(self.train_items, self.shuffle, self.seed, self.trainer)
