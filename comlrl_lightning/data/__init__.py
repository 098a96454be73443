"""DataModules and task-item loading."""

from comlrl_lightning.data.madpo import PreferenceDataModule
from comlrl_lightning.data.sources import build_formatters, load_task_items

__all__ = ["PreferenceDataModule", "build_formatters", "load_task_items"]
