"""Task-item loading (``sources``) and the LightningDataModules, one file per method: every public class is
importable from here."""

from comlrl_lightning.data.centralized import CentralizedTaskDataModule
from comlrl_lightning.data.madpo import IterativePreferenceDataModule, PreferenceDataModule
from comlrl_lightning.data.marlhf import MARLHFIterDataModule
from comlrl_lightning.data.reward_model import RewardPairDataModule
from comlrl_lightning.data.sources import build_formatters, load_task_items
from comlrl_lightning.data.task import TaskDataModule

__all__ = ["CentralizedTaskDataModule", "IterativePreferenceDataModule", "MARLHFIterDataModule",
           "PreferenceDataModule", "RewardPairDataModule", "TaskDataModule", "build_formatters", "load_task_items"]
