"""Actor-critic episodes without a model: per-sample records, turn rewards, TD targets and returns.

One IAC/MAAC episode is a task item rolled out for T′ ≤ ``num_turns`` turns; at every turn each agent
writes K = ``num_generations`` completions (K = 1 in multi-turn). Every (agent, turn, generation) gives one
:class:`EpisodeSample`. The actor-critic module samples and evaluates the critic; this file turns those
numbers into training records:

* :func:`turn_rewards` calls the reward oracle once per turn and spreads its 1, K or N values over the
  ``[agent][generation]`` grid; the turn's mean decides early termination;
* :func:`score_turn` records r, V_old (or Q_old), the reference KL and the shaped reward ``r̃ = r − β·KL``;
* :func:`finish_episode` gives every (agent, generation) trajectory its one-step TD targets
  ``y_t = r̃_t + γ·V_old(h_{t+1})`` with no bootstrap after the last executed turn (horizon or early
  termination: ``y_{T′−1} = r̃_{T′−1}``) and its undiscounted return-to-go ``G_t = Σ_{u≥t} r̃_u``.

:func:`run_episode` drives one episode with injected ``sample``/``reward``/``transition``/``values``
callables (as :func:`comlrl_lightning.multiturn.tree.build_tree` does for MAGRPO), so turn order, early
termination and targets can be tested without a model; :func:`run_episodes` drives the episodes of a batch in
lockstep, so each turn is one batched sampling call per agent.

The advantage of a sample is ``A = y − V_old`` (:func:`comlrl_lightning.losses.td_advantages`), computed
when its agent's buffer is drained. No Lightning import: everything here is testable with plain numbers.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from comlrl_lightning.losses import reward_to_go, td_targets
from comlrl_lightning.rewards import RewardError, call_reward_function

# the record's dict keys that differ from its field names (``return`` is a Python keyword)
_KEY_TO_FIELD = {"return": "return_to_go"}
_FIELD_TO_KEY = {v: k for k, v in _KEY_TO_FIELD.items()}


@dataclass
class EpisodeSample:
    """One completion of one agent at one turn, with what training needs of it.

    ``prompt_ids``/``completion_ids`` are the agent's tokens (the completion as sampled; padding after EOS
    is dropped when it is scored); ``critic_ids`` the MAAC critic's joint input (None for IAC); ``item`` the
    task item's index (or an evaluation label). Samples read like upstream's rollout dicts too
    (``sample["reward"]``, ``sample["return"]``), which is what a ``metrics_callback`` receives.
    """

    agent: int
    turn: int
    gen: int
    item: Any
    prompt_ids: list[int]
    completion_ids: list[int]
    text_len: int = 0
    critic_ids: list[int] | None = None
    reward: float = 0.0
    old_value: float = 0.0
    kl: float | None = None
    shaped: float = 0.0
    target: float = 0.0
    return_to_go: float = 0.0
    version: int = 0
    """How many updates the agent had taken when its weights sampled this completion (set by the trainer)."""
    engine_logprobs: list[float] | None = None
    """The engine's per-token log-probs of the completion (weight-sync verification), or None."""

    def __getitem__(self, key: str) -> Any:
        name = _KEY_TO_FIELD.get(key, key)
        if name not in _FIELD_NAMES:
            raise KeyError(key)
        return getattr(self, name)

    def as_dict(self) -> dict[str, Any]:
        """Plain types only (checkpoints are loaded ``weights_only``), keyed like upstream's rollout dicts."""
        return {_FIELD_TO_KEY.get(k, k): v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> EpisodeSample:
        return cls(**{_KEY_TO_FIELD.get(k, k): v for k, v in record.items() if _KEY_TO_FIELD.get(k, k) in
                      _FIELD_NAMES})


_FIELD_NAMES = frozenset(f.name for f in fields(EpisodeSample))


def first_prompt(formatter: Callable, item: dict, agent: int, where: str) -> str:
    """Turn-0 prompt of one agent: ``formatter(item)`` (with ``external_prompts=None`` if it declares it)."""
    try:
        declares = "external_prompts" in inspect.signature(formatter).parameters
    except (TypeError, ValueError):
        declares = False
    try:
        text = formatter(item, external_prompts=None) if declares else formatter(item)
    except KeyError as exc:
        raise ValueError(f"{where}: agent {agent}'s formatter needs field {exc.args[0]!r} (item keys: "
                         f"{sorted(item)}).") from exc
    if not isinstance(text, str) or not text:
        raise ValueError(f"Formatter must return a string prompt: agent {agent}'s formatter returned {text!r} on "
                         f"{where}.")
    return text


def reward_matrix(values: Sequence[float], num_agents: int, k: int, where: str, method: str
                  ) -> tuple[list[list[float]], float]:
    """Spread one turn's reward values over ``[agent][generation]``; also return their mean.

    1 value: everyone gets it; K values: generation g's value for every agent; N values: agent a's value
    for all its generations (when K = N, the K reading wins).
    """
    values = list(values)
    n = num_agents
    if n > 1 and len(values) == 1:
        values = values * n
    if not values or (n > 1 and len(values) not in (n, k)):
        raise RewardError(f"Reward function must return either 1 or N values per prompt for multi-agent "
                          f"{method}: got {len(values)} values on {where} (N={n}, num_generations={k}).")
    if len(values) == 1:
        matrix = [[values[0]] * k for _ in range(n)]
    elif len(values) == k:
        matrix = [list(values) for _ in range(n)]
    elif len(values) == n:
        matrix = [[values[a]] * k for a in range(n)]
    else:
        raise RewardError(f"reward_func returned {len(values)} values on {where}; expected 1, num_generations "
                          f"({k}) or num_agents ({n}).")
    return matrix, sum(values) / len(values)


def turn_rewards(oracle: Any, prompts: list[str], texts: list[list[str]], item: dict, where: str, num_agents: int,
                 k: int, method: str) -> tuple[list[list[float]], float]:
    """One reward call for a turn → (``[agent][generation]`` rewards, the mean that early termination reads).

    ``oracle`` has ``reward_func`` (called with the usual signature dispatch) and an optional
    ``reward_processor`` applied to every value; every processed value must be finite.
    """
    try:
        raw = call_reward_function(oracle.reward_func, prompts, texts, [item])
    except Exception as exc:
        raise RewardError(f"reward_func failed on {where}: {type(exc).__name__}: {exc}") from exc
    values = []
    for v in raw:
        try:
            p = float(oracle.reward_processor(v)) if oracle.reward_processor is not None else v
        except Exception as exc:
            raise RewardError(f"reward_processor failed on {where} (raw reward {v!r}): {exc}") from exc
        if not math.isfinite(p):
            raise RewardError(f"reward is {p} on {where} (raw {v!r}); rewards must be finite numbers.")
        values.append(p)
    return reward_matrix(values, num_agents, k, where, method)


def score_turn(turn: Sequence[Sequence[EpisodeSample]], rewards: Sequence[Sequence[float]],
               values: Sequence[Sequence[float]], kls: Sequence[Sequence[float]] | None, kl_coef: float) -> None:
    """Record r, V_old, KL and ``r̃ = r − β·KL`` (``r̃ = r`` when ``kls`` is None) on ``turn[agent][gen]``."""
    for j, samples in enumerate(turn):
        for g, s in enumerate(samples):
            s.reward = float(rewards[j][g])
            s.old_value = float(values[j][g])
            s.kl = float(kls[j][g]) if kls is not None else None
            s.shaped = s.reward - (kl_coef * s.kl if s.kl is not None else 0.0)


def finish_episode(turns: Sequence[Sequence[Sequence[EpisodeSample]]], discount: float) -> list[EpisodeSample]:
    """Set TD targets and returns of every executed turn; ``turns[t][agent][gen]``, already scored.

    Per (agent, generation) trajectory over the T′ executed turns: ``y_t = r̃_t + γ·V_old(h_{t+1})`` for
    t < T′−1, ``y_{T′−1} = r̃_{T′−1}``; ``G_t = Σ_{u≥t} r̃_u``. Returns the samples agent by agent, then
    generation, then turn.
    """
    out: list[EpisodeSample] = []
    if not turns:
        return out
    for j in range(len(turns[0])):
        for g in range(len(turns[0][j])):
            traj = [turns[t][j][g] for t in range(len(turns))]
            shaped = torch.tensor([s.shaped for s in traj], dtype=torch.float64)
            next_v = torch.tensor([s.old_value for s in traj[1:]] + [0.0], dtype=torch.float64)
            for s, y, ret in zip(traj, td_targets(shaped, next_v, discount).tolist(), reward_to_go(shaped).tolist()):
                s.target, s.return_to_go = float(y), float(ret)
            out.extend(traj)
    return out


def run_episode(
    num_agents: int,
    num_generations: int,
    num_turns: int,
    prompts: list[str],
    sample: Callable[[int, int, str], tuple[list[int], list[list[int]], list[str]]],
    reward: Callable[[list[str], list[list[str]], int], tuple[list[list[float]], float]],
    values: Callable[[list[list[EpisodeSample]]], list[list[float]]],
    discount: float,
    transition: Callable[[list[str], list[list[str]], list[list[str]], int], list[str]] | None = None,
    kls: Callable[[list[list[EpisodeSample]]], list[list[float]]] | None = None,
    kl_coef: float = 0.0,
    critic_ids: Callable[[list[str], list[str]], list[int]] | None = None,
    early_termination_threshold: float | None = None,
    item: Any = 0,
) -> list[EpisodeSample]:
    """Roll out one episode with injected callables; returns every sample with targets and returns set.

    Per turn t: later turns take their prompts from ``transition(previous_texts, prompt_history,
    response_history, t − 1)``; ``sample(agent, t, prompt)`` gives ``(prompt_ids, K completion_ids, K texts)``
    per agent; ``reward(prompts, texts, t)`` the ``[agent][generation]`` rewards and their mean;
    ``critic_ids(prompts, joint_texts)`` (MAAC) one joint critic input per generation, shared by the agents;
    ``values(turn)`` / ``kls(turn)`` the rollout-time V_old and reference KL of ``turn[agent][gen]``. The
    episode stops after the horizon or once the turn's mean reward exceeds ``early_termination_threshold``.
    Histories hold each agent's prompts and first completions.
    """
    return run_episodes(
        num_agents, num_generations, num_turns, [prompts],
        lambda agent, t, level: [sample(agent, t, p) for p in level],
        lambda _e, p, x, t: reward(p, x, t), values, discount,
        None if transition is None else (lambda _e, *args: transition(*args)),
        kls, kl_coef, critic_ids, early_termination_threshold, [item])[0]


def run_episodes(
    num_agents: int,
    num_generations: int,
    num_turns: int,
    prompts: Sequence[list[str]],
    sample_level: Callable[[int, int, list[str]], list[tuple[list[int], list[list[int]], list[str]]]],
    reward: Callable[[int, list[str], list[list[str]], int], tuple[list[list[float]], float]],
    values: Callable[[list[list[EpisodeSample]]], list[list[float]]],
    discount: float,
    transition: Callable[[int, list[str], list[list[str]], list[list[str]], int], list[str]] | None = None,
    kls: Callable[[list[list[EpisodeSample]]], list[list[float]]] | None = None,
    kl_coef: float = 0.0,
    critic_ids: Callable[[list[str], list[str]], list[int]] | None = None,
    early_termination_threshold: float | None = None,
    items: Sequence[Any] | None = None,
    sample_team_level: Callable[[int, list[list[str]]], list[list[tuple[list[int], list[list[int]], list[str]]]]]
    | None = None,
) -> list[list[EpisodeSample]]:
    """Roll out several episodes in lockstep; per episode, its samples as :func:`run_episode` returns them.

    Each turn, the prompts of every episode still running are sampled by one ``sample_level(agent, t,
    prompts)`` call per agent (one ``(prompt_ids, K completion_ids, K texts)`` per prompt, in order), or by one
    ``sample_team_level(t, prompts per agent)`` call for all agents when given (one engine call for the level,
    whose agents may then generate at the same time: docs/architecture.md, "Devices"), and
    ``values``/``kls`` are called once on the turn's samples of all those episodes (``[agent][episode-major
    generation]``); rewards, transitions (``reward(e, ...)``, ``transition(e, ...)``: ``e`` indexes
    ``prompts``), early termination, targets and returns stay per episode.
    """
    n, k = num_agents, num_generations
    items = list(range(len(prompts))) if items is None else list(items)
    current = [list(p) for p in prompts]
    p_hist = [[[] for _ in range(n)] for _ in prompts]
    r_hist = [[[] for _ in range(n)] for _ in prompts]
    turns: list[list[list[list[EpisodeSample]]]] = [[] for _ in prompts]  # [episode][turn][agent][generation]
    running = list(range(len(prompts)))
    for t in range(num_turns):
        if not running:
            break
        if t > 0:
            if transition is None:
                raise ValueError(f"A {num_turns}-turn episode needs a transition for turn {t + 1}.")
            for e in running:
                current[e] = transition(e, [h[-1] for h in r_hist[e]], p_hist[e], r_hist[e], t - 1)
        for e in running:
            for j in range(n):
                p_hist[e][j].append(current[e][j])
        asked = [[current[e][j] for e in running] for j in range(n)]
        together = sample_team_level(t, asked) if sample_team_level is not None else None
        draws = []
        for j in range(n):
            out = list(together[j] if together is not None else sample_level(j, t, asked[j]))
            if len(out) != len(running):
                raise ValueError(f"sample_level returned {len(out)} draws for agent {j}; expected {len(running)}.")
            draws.append(out)
        level: list[list[list[EpisodeSample]]] = []  # [running episode][agent][generation]
        texts: list[list[list[str]]] = []
        for i, e in enumerate(running):
            turn = [[EpisodeSample(j, t, g, items[e], draws[j][i][0], draws[j][i][1][g], len(draws[j][i][2][g]),
                                   engine_logprobs=draws[j][i][3][g] if len(draws[j][i]) > 3 and draws[j][i][3]
                                   else None)
                     for g in range(k)] for j in range(n)]
            level.append(turn)
            texts.append([list(draws[j][i][2]) for j in range(n)])
        rewards = [reward(e, current[e], texts[i], t) for i, e in enumerate(running)]
        if critic_ids is not None:
            for i, e in enumerate(running):
                for g in range(k):
                    ids = critic_ids(current[e], [texts[i][j][g] for j in range(n)])
                    for j in range(n):
                        level[i][j][g].critic_ids = ids
        flat = [[s for turn in level for s in turn[j]] for j in range(n)]  # one critic / KL pass for the level
        level_values = values(flat)
        level_kls = kls(flat) if kls is not None else None
        still = []
        for i, e in enumerate(running):
            part = slice(i * k, (i + 1) * k)
            score_turn(level[i], rewards[i][0], [list(v[part]) for v in level_values],
                       None if level_kls is None else [list(v[part]) for v in level_kls], kl_coef)
            for j in range(n):
                r_hist[e][j].append(texts[i][j][0])
            turns[e].append(level[i])
            if early_termination_threshold is None or not rewards[i][1] > early_termination_threshold:
                still.append(e)
        running = still
    return [finish_episode(ep, discount) for ep in turns]


def turn_summary(samples: Sequence[EpisodeSample], kl_coef: float | None) -> dict[str, float]:
    """Means over samples of one turn: ``reward_mean``, ``expected_return`` and, when the reference KL is
    on (``kl_coef`` not None), ``reference_kl_mean`` and ``reference_kl_penalty_mean`` (β·KL)."""
    def mean(xs: Sequence[float]) -> float:
        return sum(xs) / len(xs)

    out = {"reward_mean": mean([s.reward for s in samples]),
           "expected_return": mean([s.return_to_go for s in samples])}
    if kl_coef is not None:
        kl = mean([s.kl for s in samples])
        out["reference_kl_mean"] = kl
        out["reference_kl_penalty_mean"] = kl_coef * kl
    return out
