"""Multi-turn machinery: external transitions and the MAGRPO rollout tree."""

from comlrl_lightning.multiturn.transitions import (
    TransitionError,
    call_transition,
    next_prompts,
    plain_transition,
)
from comlrl_lightning.multiturn.tree import AgentDraw, Node, NodeSample, build_tree, build_trees, node_samples

__all__ = ["AgentDraw", "Node", "NodeSample", "TransitionError", "build_tree", "build_trees", "call_transition",
           "next_prompts", "node_samples", "plain_transition"]
