"""Network components with no training logic: value heads and critics on causal-LM backbones."""

from comlrl_lightning.nets.critics import (
    ValueCritic,
    ValueHead,
    build_critics,
    hidden_size_of,
    joint_critic_text,
    load_critic_backbones,
    resolve_critic_sources,
)

__all__ = ["ValueCritic", "ValueHead", "build_critics", "hidden_size_of", "joint_critic_text", "load_critic_backbones",
           "resolve_critic_sources"]
