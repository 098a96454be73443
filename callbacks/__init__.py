"""Lightning callbacks of comlrl-lightning, importable as ``comlrl_lightning.callbacks``."""

# The folder is reachable from the repository root as a top-level ``callbacks`` package too; importing it under
# that name would give every class a second module object (isinstance across them fails). One name only.
if __name__ != "comlrl_lightning.callbacks":
    raise ImportError(f"The callbacks package is comlrl_lightning.callbacks; it was imported as {__name__!r}. "
                      "Import comlrl_lightning.callbacks (e.g. `from comlrl_lightning.callbacks import "
                      "ExportAgents`) instead.")

from comlrl_lightning.callbacks.best_agents import BestAgents
from comlrl_lightning.callbacks.comparator_refresh import ComparatorRefresh
from comlrl_lightning.callbacks.evaluation import TaskRewardEvaluation
from comlrl_lightning.callbacks.export import ExportAgents
from comlrl_lightning.callbacks.history_checkpoint import HistoryCheckpoint
from comlrl_lightning.callbacks.iterative_collection import IterativePreferenceCollection, ScoredPreferenceCollection
from comlrl_lightning.callbacks.preference_collection import PreferenceCollection
from comlrl_lightning.callbacks.progress import TeamProgressBar
from comlrl_lightning.callbacks.replay_selection import ReplaySelection
from comlrl_lightning.callbacks.reward_distribution import RewardDistributionLogger
from comlrl_lightning.callbacks.reward_model import IterativeRewardModelFit, LearnedRewardFit

__all__ = ["BestAgents", "ComparatorRefresh", "ExportAgents", "HistoryCheckpoint", "IterativePreferenceCollection",
           "IterativeRewardModelFit", "LearnedRewardFit", "PreferenceCollection", "ReplaySelection",
           "RewardDistributionLogger", "ScoredPreferenceCollection", "TaskRewardEvaluation", "TeamProgressBar"]
