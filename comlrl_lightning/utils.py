"""CoMLRL's ``comlrl.utils`` helpers that users call directly (docs/coming-from-comlrl.md).

Only the user-facing ones: the reward-range helpers, the reward-function dispatch, the reward processors and
the formatter builder. CoMLRL's model/tokenizer/device/distributed helpers are internal here (the table in
docs/coming-from-comlrl.md says what replaces each).
"""

from __future__ import annotations

from comlrl_lightning.data.sources import build_formatters
from comlrl_lightning.distributions import resolve_reward_range
from comlrl_lightning.rewards import RewardProcessors, call_reward_function, set_reward_range

__all__ = ["RewardProcessors", "build_formatters", "call_reward_function", "resolve_reward_range",
           "set_reward_range"]
