"""Lightning callbacks of comlrl-lightning, importable as ``comlrl_lightning.callbacks``."""

from comlrl_lightning.callbacks.evaluation import TaskRewardEvaluation
from comlrl_lightning.callbacks.export import ExportAgents
from comlrl_lightning.callbacks.preference_collection import PreferenceCollection

__all__ = ["ExportAgents", "PreferenceCollection", "TaskRewardEvaluation"]
