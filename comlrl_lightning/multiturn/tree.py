"""The multi-turn MAGRPO rollout tree of one task item (docs/multiturn.md §2.2-2.7).

Each node samples K = ``num_generations`` completions per agent,
forms B joint actions (aligned: B = K, joint action j = the j-th completion of every agent; cross: B = K^N,
every index tuple in lexicographic order), scores each joint action with ``reward`` (one call each), and,
unless it is at the last turn or early-terminated, expands one child per joint action through the external
``transition`` (one call per joint action, with that branch's own histories).

Returns are undiscounted and tree-averaged: R(j) = r(j) + mean over the child's B returns (a leaf: R = r).
Per agent, the return vector over its own K completions is R itself (aligned) or, in cross mode, the
**sum** of the joint returns that use each completion (docs/multiturn.md §2.6; ``crossed`` is ``cross`` everywhere).
Reference KL shapes that vector at its own node only: G'_k = G_k − β·KL_k (docs/multiturn.md §2.7, §9); then the
baseline and normalisation over the K siblings (:func:`comlrl_lightning.losses.group_advantages`).

The trees are built level by level (:func:`build_trees`): all nodes of one turn, across every item of a
batch, are sampled by one ``sample_level`` call per agent, so a model generates a whole level in one batched
call; env_step numbers and returns are those of the depth-first pre-order construction.

The builder is model-free: ``sample_level`` (or a per-node ``sample``), ``reward`` and ``transition`` are
injected callables, so tree shapes and call counts can be tested without a model. Call counts per item
without early termination (docs/multiturn.md §2.3): draws N·Σ_{t<T} B^t (``sample_level`` N·T calls for a
batch), ``reward`` Σ_{t<T} B^{t+1}, ``transition`` Σ_{t<T-1} B^{t+1}, env_step advance Σ_{t<T} B^{t+1}.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from comlrl_lightning.losses import group_advantages, kl_penalized_returns


@dataclass
class AgentDraw:
    """What one agent produced at one node.

    ``prompt`` is the text the agent was prompted with (after the formatter); ``prompt_used`` is what
    upstream records in the prompt history and passes to the reward (the formatter output at turn 0, the
    transition's raw string later); ``prompt_ids`` the prompt tokens; ``completion_ids`` K token lists
    (trimmed at the first pad); ``texts`` K decoded completions; ``kls`` K sequence KLs (None when off);
    ``logprobs`` the engine's K per-token log-prob lists (None when the engine reports none).
    """

    prompt: str
    prompt_used: str
    prompt_ids: list[int]
    completion_ids: list[list[int]]
    texts: list[str]
    kls: list[float] | None = None
    logprobs: list[list[float]] | None = None


@dataclass
class Node:
    """One tree node: the draws of every agent, B joint actions, their rewards, children and returns."""

    turn: int
    path: tuple[int, ...]
    draws: list[AgentDraw]
    joint: list[tuple[int, ...]]
    rewards: list[float]
    env_step: int
    terminated: bool = False
    children: list[Node] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards)

    @property
    def mean_return(self) -> float:
        return sum(self.returns) / len(self.returns)

    def walk(self):
        """Pre-order traversal (creation order; env_step increases along it)."""
        yield self
        for c in self.children:
            yield from c.walk()


@dataclass
class NodeSample:
    """One agent's training sample from one node: K completions with their advantages (docs/multiturn.md §2.6)."""

    agent: int
    turn: int
    env_step: int
    prompt_ids: list[int]
    completion_ids: list[list[int]]
    returns: list[float]
    advantages: list[float]
    kls: list[float] | None
    node_mean_reward: float
    node_mean_return: float
    reward_std: float
    version: int = 0
    """How many updates the agent had taken when its weights sampled this node (set by the trainer)."""
    engine_logprobs: list[list[float]] | None = None
    """The engine's per-token log-probs of the K completions (weight-sync verification), or None."""


SampleFn = Callable[[int, int, str, str], AgentDraw]
"""``sample(agent, turn, prompt, prompt_used) -> AgentDraw`` with K completions (one node)."""
LevelSampleFn = Callable[[int, int, list[tuple[str, str]]], list[AgentDraw]]
"""``sample_level(agent, turn, [(prompt, prompt_used), ...]) -> [AgentDraw, ...]``: one draw of K completions per
node of a level, in order (one batched generate call)."""
TeamLevelSampleFn = Callable[[int, list[list[tuple[str, str]]]], list[list[AgentDraw]]]
"""``sample_team_level(turn, per agent [(prompt, prompt_used), ...]) -> per agent [AgentDraw, ...]``: the whole
level for every agent at once (one engine call may serve all agents, e.g. mixed LoRA adapters)."""
RewardFn = Callable[[list[str], list[str], int, tuple[int, ...]], float]
"""``reward(prompts, joint_texts, turn, path) -> float``: the processed, checked joint reward."""
TransitionFn = Callable[[list[str], list[list[str]], list[list[str]], int, tuple], list[tuple[str, str]]]
"""``transition(joint_texts, prompt_history, response_history, turn, path) -> per agent (prompt, prompt_used)``
for turn+1: the external transition's strings already resolved through the formatters (docs/multiturn.md §7.3)."""


def joint_actions(num_agents: int, k: int, joint_mode: str) -> list[tuple[int, ...]]:
    """Index tuples of the joint actions of a node: aligned (j, j, ..., j) for j < K; cross: the Cartesian
    product [0, K)^N in lexicographic order. With one agent both are the K single indices."""
    if joint_mode == "aligned" or num_agents == 1:
        return [(j,) * num_agents for j in range(k)]
    if joint_mode == "cross":
        return list(itertools.product(range(k), repeat=num_agents))
    raise ValueError(f"Unsupported joint_mode: {joint_mode!r}. Allowed: aligned, cross.")


def build_tree(
    num_agents: int,
    num_generations: int,
    num_turns: int,
    joint_mode: str,
    root_prompts: Sequence[tuple[str, str]],
    sample: SampleFn | None,
    reward: RewardFn,
    transition: TransitionFn | None,
    early_termination_threshold: float | None = None,
    env_step: int = 0,
    sample_level: LevelSampleFn | None = None,
) -> tuple[Node, int]:
    """Build the rollout tree of one item; returns (root, new env_step). See :func:`build_trees`.

    Args:
        root_prompts: per agent (prompt, prompt_used) at turn 0.
        sample: see :data:`SampleFn` (one call per agent per node); ignored when ``sample_level`` is given.
        reward: see :data:`RewardFn`; receives ``prompts = [agent 0's prompt_used]``.
        transition: see :data:`TransitionFn` (the histories include the turn just generated; ``path`` is the
            tuple of joint actions from the root); required when ``num_turns > 1``.
        early_termination_threshold: stop expanding a node whose mean immediate reward is > this.
        env_step: the counter before this tree; each node adds B.
        sample_level: see :data:`LevelSampleFn` (one call per agent per level).
    """
    if sample_level is None:
        if sample is None:
            raise ValueError("build_tree needs `sample` or `sample_level`.")

        def sample_level(agent, turn, prompts):
            return [sample(agent, turn, p, u) for p, u in prompts]

    roots, env_step = build_trees(
        num_agents, num_generations, num_turns, joint_mode, [root_prompts], sample_level,
        lambda _tree, *args: reward(*args),
        None if transition is None else (lambda _tree, *args: transition(*args)),
        early_termination_threshold, env_step)
    return roots[0], env_step


def build_trees(
    num_agents: int,
    num_generations: int,
    num_turns: int,
    joint_mode: str,
    root_prompts: Sequence[Sequence[tuple[str, str]]],
    sample_level: LevelSampleFn,
    reward: Callable[..., float],
    transition: Callable[..., list[tuple[str, str]]] | None,
    early_termination_threshold: float | None = None,
    env_step: int = 0,
    sample_team_level: TeamLevelSampleFn | None = None,
) -> tuple[list[Node], int]:
    """Build the rollout trees of several items level by level; returns (roots, new env_step).

    Turn by turn, every node of the level, across all trees, is sampled by one ``sample_level`` call per
    agent (nodes ordered by tree, then parent, then joint action); then each node is scored and expanded on
    its own. The trees equal those of a depth-first pre-order construction from the same draws: env_step
    values are assigned afterwards in pre-order, tree after tree (docs/multiturn.md §2.2), and returns
    post-order (docs/multiturn.md §2.5).

    Args:
        root_prompts: per tree, per agent (prompt, prompt_used) at turn 0.
        reward: ``reward(tree, prompts, joint_texts, turn, path) -> float`` (``tree`` indexes ``root_prompts``).
        transition: ``transition(tree, joint_texts, prompt_history, response_history, turn, path)``; required
            when ``num_turns > 1``.
        sample_team_level: see :data:`TeamLevelSampleFn`; when given, it replaces the ``sample_level`` calls
            (one call per level instead of one per agent per level).
        Other args as :func:`build_tree`.
    """
    if num_turns > 1 and transition is None:
        raise ValueError("Multi-turn MAGRPO requires an external_transition (num_turns > 1).")
    n = num_agents
    joint = joint_actions(n, num_generations, joint_mode)
    roots: list[Node] = []
    # a pending node: (tree, parent or None, path, per-agent (prompt, prompt_used), prompt and response histories)
    level = [(i, None, (), list(p), [[] for _ in range(n)], [[] for _ in range(n)])
             for i, p in enumerate(root_prompts)]
    for turn in range(num_turns):
        if not level:
            break
        per_agent = []
        together = (sample_team_level(turn, [[entry[3][a] for entry in level] for a in range(n)])
                    if sample_team_level is not None else None)
        for a in range(n):
            draws = list(together[a] if together is not None
                         else sample_level(a, turn, [entry[3][a] for entry in level]))
            if len(draws) != len(level):
                raise ValueError(f"sample_level returned {len(draws)} draws for agent {a}; expected one per "
                                 f"node of the level ({len(level)}).")
            for d in draws:
                if len(d.texts) != num_generations or len(d.completion_ids) != num_generations:
                    raise ValueError(f"sample returned {len(d.texts)} completions for agent {a}; expected "
                                     f"num_generations={num_generations}.")
            per_agent.append(draws)
        next_level = []
        for idx, (tree, parent, path, _prompts, p_hist, r_hist) in enumerate(level):
            draws = [per_agent[a][idx] for a in range(n)]
            used = [d.prompt_used for d in draws]
            rewards = []
            for ja in joint:
                texts = [draws[a].texts[ja[a]] for a in range(n)]
                rewards.append(float(reward(tree, [used[0]], texts, turn, path + (ja,))))
            node = Node(turn=turn, path=path, draws=draws, joint=joint, rewards=rewards, env_step=0)
            (roots if parent is None else parent.children).append(node)
            if early_termination_threshold is not None:
                node.terminated = node.mean_reward > early_termination_threshold
            if turn < num_turns - 1 and not node.terminated:
                new_p_hist = [p_hist[a] + [used[a]] for a in range(n)]
                for ja in joint:
                    texts = [draws[a].texts[ja[a]] for a in range(n)]
                    new_r_hist = [r_hist[a] + [texts[a]] for a in range(n)]
                    nxt = transition(tree, texts, new_p_hist, new_r_hist, turn, path + (ja,))
                    next_level.append((tree, node, path + (ja,), list(nxt), new_p_hist, new_r_hist))
        level = next_level
    for root in roots:
        for node in root.walk():  # the depth-first construction's numbering: +B per node, pre-order
            env_step += len(node.joint)
            node.env_step = env_step
        _set_returns(root)
    return roots, env_step


def _set_returns(node: Node) -> None:
    """R(j) = r(j) + mean of the child's returns (a leaf: R = r), post-order (docs/multiturn.md §2.5)."""
    for c in node.children:
        _set_returns(c)
    node.returns = [r + (node.children[j].mean_return if node.children else 0.0) for j, r in enumerate(node.rewards)]


def agent_returns(node: Node, agent: int, num_generations: int) -> list[float]:
    """G_a over agent a's own K completions (docs/multiturn.md §2.6): the joint returns (aligned) or, in cross mode, for
    each completion k the **sum** of the returns of the joint actions whose a-component is k. (In aligned
    mode exactly one joint action uses completion k, so the sum is R(k) itself.)"""
    out = [0.0] * num_generations
    for ja, ret in zip(node.joint, node.returns):
        out[ja[agent]] += ret
    return out


def node_samples(
    root: Node,
    num_agents: int,
    num_generations: int,
    advantage_mode: str,
    normalize: bool,
    kl_coef: float = 0.0,
) -> list[NodeSample]:
    """Every node's per-agent samples, in pre-order (ascending env_step), agents in index order."""
    out = []
    for node in root.walk():
        std = _pop_std(node.rewards)
        for a in range(num_agents):
            g = agent_returns(node, a, num_generations)
            shaped = torch.tensor(g, dtype=torch.float64)
            kls = node.draws[a].kls
            if kls is not None and kl_coef:
                shaped = kl_penalized_returns(shaped, kls, kl_coef)
            adv = group_advantages(shaped, advantage_mode, normalize)
            d = node.draws[a]
            out.append(NodeSample(agent=a, turn=node.turn, env_step=node.env_step, prompt_ids=list(d.prompt_ids),
                                  completion_ids=[list(c) for c in d.completion_ids], returns=g,
                                  advantages=adv.tolist(), kls=None if kls is None else list(kls),
                                  engine_logprobs=d.logprobs,
                                  node_mean_reward=node.mean_reward, node_mean_return=node.mean_return,
                                  reward_std=std))
    return out


def _pop_std(values: Sequence[float]) -> float:
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def max_nodes_per_tree(num_agents: int, num_generations: int, num_turns: int, joint_mode: str) -> int:
    """The most node samples one tree gives each agent: Σ_{t<T} B^t with B = K (aligned) or K^N (cross), reached
    when no branch terminates early (docs/multiturn.md §2.3)."""
    branches = len(joint_actions(num_agents, num_generations, joint_mode))
    return sum(branches ** t for t in range(num_turns))


def rollout_window(buffered: Sequence[int], buffer_size: int, max_samples_per_item: int, available: int) -> int:
    """How many of the next ``available`` items can be rolled out together, exactly on-policy.

    With one item per training step, an agent is updated (its buffer drained) as soon as its buffer holds
    ``buffer_size`` samples, and the next item is sampled by the updated weights. Items rolled out together are
    sampled by the same weights, so only the last of them may trigger an update: with ``b_a`` samples buffered for
    agent a and at most ``M`` samples per item and agent, the first ``m - 1`` items can never fill a buffer when
    ``b_a + (m - 1)·M < buffer_size`` for every agent, hence

        m = min(available, 1 + min_a ⌊(buffer_size − 1 − b_a) / M⌋),  at least 1.

    Without early termination every item gives exactly M samples and the window ends at the item that triggers the
    update; with it, items may give fewer and the window is merely shorter (never stale).
    """
    if available < 1:
        return 0
    room = min((buffer_size - 1 - b) // max_samples_per_item for b in buffered) if buffered else 0
    return max(1, min(available, 1 + room))


def update_windows(batch: Sequence, buffered: Callable[[], Sequence[int]], buffer_size: int,
                   max_samples_per_item: int, whole: bool = False) -> Iterator[list]:
    """Cut a training batch into the item groups rolled out together: :func:`rollout_window` items at a time, each
    window computed when it is asked for, from ``buffered()`` (the samples per agent that the previous windows
    left in the buffers). ``whole``: the batch is one window (a fixed ``generation_batch_size``)."""
    pos = 0
    while pos < len(batch):
        left = len(batch) - pos
        size = left if whole else rollout_window(buffered(), buffer_size, max_samples_per_item, left)
        yield list(batch[pos:pos + size])
        pos += size
