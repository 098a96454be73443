"""MAGRPOModule: multi-agent GRPO and its REINFORCE-family variants over multi-turn rollout trees.

One training step = one batch of task items = one rollout tree per item (docs/multiturn.md §2.1-2.7, built by
:func:`comlrl_lightning.multiturn.tree.build_trees`). The batch is cut into update windows (docs/multiturn.md §2.11):
the items up to the one whose samples trigger the next update are rolled out together, one batched ``generate`` per
agent per tree level covering every node of the level in every tree of the window, so each tree is sampled by exactly
the weights that would sample it with one item per step (``generation_batch_size`` trades this for larger
batches). The node samples enter per-agent buffers item by item, in env-step order; an agent whose buffer holds
``rollout_buffer_size`` samples is drained: its samples are split by turn, shuffled, cut into minibatches of
``train_batch_size`` node samples, one AdamW step each (docs/multiturn.md §2.9). Remaining samples are flushed at
the last step of every epoch.

Loss of one node sample (K completions y_k of prompt x, advantages Â_k; docs/multiturn.md §2.8):
``L = (1/K') Σ_k −Â_k Σ_t log π(y_kt | x, y_k,<t)`` over the completion tokens up to and including the
first EOS (never the padding after it: docs/decisions.md, decision 4); a minibatch's loss is the mean of its samples'
losses.

Deliberate deviations from upstream 1.4.3 (documented choices, docs/multiturn.md §13): padding after EOS is masked;
the prompt length is the true prompt length; ``crossed`` means ``cross`` everywhere (also in the credit
assignment); ``joint_mode`` and ``advantage_mode`` are checked in the config; a non-finite loss raises
instead of being replaced by 0.1; rewards in cross mode use the same signature dispatch as aligned mode.

Counters: ``env_step`` (+B per tree node, docs/multiturn.md §2.2), ``updates_seen`` (training items processed; the
evaluation callback's clock, like upstream's ``batch_idx``), ``optimizer_steps`` (AdamW steps of all
agents). ``trainer.global_step`` counts the optimizer steps taken inside ``training_step`` (every agent's).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from comlrl_lightning.config import MAGRPOConfig
from comlrl_lightning.data.sources import format_prompts
from comlrl_lightning.distributed import world
from comlrl_lightning.engines import SampleRequest, engine_of
from comlrl_lightning.engines.verify import check_engine_version, check_logprob_gap
from comlrl_lightning.evaluation import EvalMetrics, balanced_evaluation, with_turn_mean
from comlrl_lightning.generation import Samples, SamplingStream
from comlrl_lightning.logging_utils import log_metrics
from comlrl_lightning.logprobs import build_scoring_batch, scored_token_logps, trim_completion
from comlrl_lightning.losses import policy_gradient_loss
from comlrl_lightning.metrics import mean_across_ranks
from comlrl_lightning.modules.base import TeamModuleBase
from comlrl_lightning.multiturn.transitions import call_transition, next_prompts
from comlrl_lightning.multiturn.tree import (
    AgentDraw,
    NodeSample,
    build_trees,
    max_nodes_per_tree,
    node_samples,
)
from comlrl_lightning.overlap import MainThread
from comlrl_lightning.protocols import RolloutTask, check_protocol
from comlrl_lightning.reference import ReferencePolicies, sequence_kl
from comlrl_lightning.tiny import TINY_MODEL_NAME


def completion_batch(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], tokenizer
                     ) -> dict[str, torch.Tensor]:
    """Right-padded ``[prompt ; completion]`` rows with ``score_mask`` on every kept completion token."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    rows = [trim_completion(c, eos, pad) for c in completion_ids]
    return build_scoring_batch(prompt_ids, rows, pad, drop_last=False, eos_id=eos)


class MAGRPOModule(TeamModuleBase):
    """MAGRPO / MAREINFORCE / MARLOO / MAReMax (``args.advantage_mode``) as one LightningModule.

    Args as :class:`~comlrl_lightning.modules.base.TeamModuleBase`, with ``args`` a
    :class:`~comlrl_lightning.config.MAGRPOConfig` (or a subclass config); an agent's scheduler steps
    after each of its optimizer steps.

    The task (items, formatters, reward, transition) comes from the datamodule
    (:class:`~comlrl_lightning.data.task.TaskDataModule`).
    """

    algorithm_name = "MAGRPO"

    def __init__(self, agent_model: str | None = TINY_MODEL_NAME, agents: Sequence[Any] | None = None,
                 tokenizer: Any = None, model_config: dict | None = None, lora: dict | None = None,
                 args: MAGRPOConfig | None = None, optimizer: OptimizerCallable | None = None,
                 lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__()
        self.args: MAGRPOConfig = args if args is not None else MAGRPOConfig()
        self.save_redacted_hyperparameters(ignore=["agents", "tokenizer", "optimizer", "lr_scheduler"])
        self.init_team(agent_model, agents, tokenizer, model_config, lora, optimizer, lr_scheduler)
        # Built from the initial weights, before any checkpoint is restored (references stay the initial policy).
        self.reference = (ReferencePolicies(self.team, self.args.reference_devices)
                          if self.args.reference_kl_enabled else None)
        n = self.team.num_agents
        self.streams = self.rollout_streams(self.args.seed)
        self.shuffle_rng = random.Random(self.args.seed)
        self.rollout_buffers: list[list[NodeSample]] = [[] for _ in range(n)]
        self.optimizer_steps = 0
        self.policy_versions = [0] * n  # updates (buffer drains) of each agent so far: the version of its weights
        self._gap_version: dict[int, int | None] = {}  # per agent: the version its next minibatch checks, or None
        self._logprob_gaps: dict[int, float] = {}  # per agent: the gap measured in its last update
        self._last_logged_step: int | None = None
        self.task: RolloutTask | None = None  # the data module, bound in setup

    def setup(self, stage: str) -> None:
        seed = self.rank_rollout_seed()
        if seed is not None:  # each rank its own rollout streams (docs/scaling.md)
            self.streams, self.shuffle_rng = self.rollout_streams(seed), random.Random(seed)
        dm = self.trainer.datamodule
        if dm is None:
            return
        check_protocol(dm, RolloutTask, type(self).__name__, "data module", "TaskDataModule")
        check_transition(self.args, dm.external_transition, self.algorithm_name)
        self.task = dm

    # --- rollout -------------------------------------------------------------------------------------------
    def _sample_level(self, agent: int, prompts: Sequence[tuple[str, str]]) -> list[AgentDraw]:
        """K completions for every (prompt, prompt_used) of a level: one batched ``generate`` per agent."""
        s = engine_of(self.team).sample(agent, [p for p, _ in prompts], self.args.num_generations,
                                        self.sampling_settings(), self.streams[agent])
        return self._draws(agent, prompts, s)

    def _draws(self, agent: int, prompts: Sequence[tuple[str, str]], s: Samples) -> list[AgentDraw]:
        """One draw per prompt from what the engine returned for ``agent`` (after checking the weight version it
        sampled with), with the reference KLs when those are on."""
        check_engine_version(engine_of(self.team), agent, s, self.optimizer_steps)
        draws = [AgentDraw(p, u, s.prompt_ids[i], s.completion_ids[i], s.texts[i],
                           logprobs=None if s.logprobs is None else s.logprobs[i]) for i, (p, u) in enumerate(prompts)]
        if self.reference is not None:
            for d, kls in zip(draws, self._sequence_kls(agent, draws)):
                d.kls = kls
        return draws

    def _sample_team_level(self, prompts: Sequence[Sequence[tuple[str, str]]]) -> list[list[AgentDraw]]:
        """:meth:`_sample_level` for every agent at once: one engine call for the whole level (the HF engine
        samples agent after agent from the same streams, so its draws equal per-agent calls)."""
        k, settings = self.args.num_generations, self.sampling_settings()
        requests = [SampleRequest(a, [p for p, _ in level], k, self.streams[a]) for a, level in enumerate(prompts)]
        out = []
        for a, (level, s) in enumerate(zip(prompts, engine_of(self.team).sample_many(requests, settings))):
            out.append(self._draws(a, level, s))
        return out

    @torch.no_grad()
    def _sequence_kls(self, agent: int, draws: Sequence[AgentDraw], max_rows: int = 256) -> list[list[float]]:
        """k3 KL of each completion of each draw against the frozen reference, at generation time
        (docs/multiturn.md §9); batched over the draws' rows, ``max_rows`` per forward."""
        prompts = [d.prompt_ids for d in draws for _ in d.completion_ids]
        comps = [c for d in draws for c in d.completion_ids]
        flat: list[float] = []
        for start in range(0, len(comps), max_rows):
            batch = completion_batch(prompts[start:start + max_rows], comps[start:start + max_rows],
                                     self.team.tokenizers[agent])
            batch = {key: v.to(self.agent_device(agent)) for key, v in batch.items()}
            with self.team.activate(agent) as model:
                was_training = model.training
                model.eval()
                try:
                    policy, _ = scored_token_logps(model, batch)
                finally:
                    model.train(was_training)
            ref = self.reference.token_logps(agent, batch)
            flat += sequence_kl(policy, ref, batch["score_mask"]).tolist()
        out, row = [], 0
        for d in draws:
            out.append(flat[row:row + len(d.completion_ids)])
            row += len(d.completion_ids)
        return out

    def rollout(self, item: dict, index: Any, formatters: Sequence, oracle: Any, transition: Any = None,
                prompt_field: str = "prompt"):
        """Build the tree of one item; returns (root, node samples) and advances ``env_step``."""
        return self.rollout_batch([(index, item)], formatters, oracle, transition, prompt_field)[0]

    def rollout_batch(self, entries: Sequence[tuple[Any, dict]], formatters: Sequence, oracle: Any,
                      transition: Any = None, prompt_field: str = "prompt") -> list[tuple[Any, list[NodeSample]]]:
        """Build the trees of ``(index, item)`` entries together, level by level (one ``generate`` per agent per
        level covering every node of every tree); returns per item (root, node samples) and advances
        ``env_step`` (item after item, as if the trees were built one by one)."""
        a = self.args
        n = self.team.num_agents
        items = [item for _, item in entries]
        roots = []
        for index, item in entries:
            turn0 = [p[0] for p in format_prompts([item], formatters, offset=index if isinstance(index, int) else 0,
                                                 prompt_field=prompt_field)]
            roots.append([(p, p) for p in turn0])

        def reward(tree, prompts, texts, turn, path):
            processed, _ = oracle.score(prompts, texts, items[tree],
                                        f"{entries[tree][0]} (turn {turn + 1}, branch {list(path)})")
            return processed

        def step(tree, texts, p_hist, r_hist, turn, path):
            item = items[tree]
            ext = call_transition(transition, item.get(prompt_field, ""), texts, n, p_hist, r_hist,
                                  turn=turn, branch=list(path))
            formatted = next_prompts(ext, item, formatters, a.external_prompt_passthrough, prompt_field)
            return list(zip(formatted, ext))

        trees, self.env_step = build_trees(
            n, a.num_generations, a.num_turns, a.joint_mode, roots,
            sample_level=lambda agent, turn, prompts: self._sample_level(agent, prompts),
            sample_team_level=lambda turn, prompts: self._sample_team_level(prompts),
            reward=reward, transition=step if transition is not None else None,
            early_termination_threshold=a.early_termination_threshold, env_step=self.env_step,
        )
        coef = a.reference_kl_coef if a.reference_kl_enabled else 0.0
        return [(root, node_samples(root, n, a.num_generations, a.advantage_mode, a.advantage_normalization, coef))
                for root in trees]

    def evaluate(self, items: Sequence[dict], task: RolloutTask, seed: int = 12345, samples_per_item: int = 1) -> dict:
        """Single turn: the base's evaluation. Multi-turn: :meth:`evaluate_turns` with the task's formatters,
        oracle and transition; ``eval/reward_mean`` = the mean immediate reward over the turns."""
        if self.args.num_turns > 1:  # sharded agents: a balanced round on every rank, as the base's
            metrics = balanced_evaluation(self, lambda: self.evaluate_turns(
                items, task.formatters, task.oracle, task.external_transition, samples_per_item=samples_per_item,
                seed=seed, prompt_field=task.prompt_field), self.evaluation_where())
            return with_turn_mean(metrics, self.args.num_turns)
        return super().evaluate(items, task, seed, samples_per_item)

    @torch.no_grad()
    def evaluate_turns(self, items: Sequence[dict], formatters: Sequence, oracle: Any, transition: Any = None,
                       samples_per_item: int = 1, seed: int = 12345, prompt_field: str = "prompt") -> dict:
        """Multi-turn evaluation on single sampled paths (docs/multiturn.md §10.2): per item and sample, every agent
        writes one completion per turn, later turns go through the transition, no early termination.

        Returns ``eval/turn_{t}/reward_mean`` (mean immediate reward of turn t) and
        ``eval/turn_{t}/expected_return`` (mean undiscounted reward-to-go from turn t). Uses its own seeded
        streams, so it never disturbs training sampling.
        """
        n, turns = self.team.num_agents, self.args.num_turns
        streams = [SamplingStream(seed + 7919 * i) for i in range(n)]
        settings = self.sampling_settings()
        # one path per (item, sample), item-major; every turn samples all paths in one call per agent
        paths, firsts = [], []
        for index, item in enumerate(items):
            first = [p[0] for p in format_prompts([item], formatters, offset=index, prompt_field=prompt_field)]
            firsts.append(first)
            paths += [(index, j) for j in range(samples_per_item)]
        prompts = [[(p, p) for p in firsts[i]] for i, _ in paths]
        p_hist = [[[] for _ in range(n)] for _ in paths]
        r_hist = [[[] for _ in range(n)] for _ in paths]
        rewards = [[] for _ in range(turns)]  # per turn, one entry per (item, sample) path
        for t in range(turns):
            requests = [SampleRequest(a, [pr[a][0] for pr in prompts], 1, streams[a]) for a in range(n)]
            texts = [[row[0] for row in s.texts] for s in engine_of(self.team).sample_many(requests, settings)]
            for p, (index, j) in enumerate(paths):
                item = items[index]
                joint = [texts[a][p] for a in range(n)]
                r, _ = oracle.score([firsts[index][0]], joint, item, f"eval {index} (turn {t + 1})")
                rewards[t].append(r)
                for a in range(n):
                    p_hist[p][a].append(prompts[p][a][1])
                    r_hist[p][a].append(joint[a])
                if t < turns - 1:
                    ext = call_transition(transition, item.get(prompt_field, ""), joint, n, p_hist[p], r_hist[p],
                                          turn=t, branch=f"eval sample {j}")
                    formatted = next_prompts(ext, item, formatters, self.args.external_prompt_passthrough,
                                             prompt_field)
                    prompts[p] = list(zip(formatted, ext))
        out = EvalMetrics()  # metrics, plus what was sampled for CoMLRL's eval_logger (one path per item and sample)
        out.completions = [[r_hist[p][a] for p in range(len(paths))] for a in range(n)]
        out.batch_items = [items[i] for i, _ in paths]
        out.raw_prompts = [items[i].get(prompt_field, "") for i, _ in paths]
        for t in range(turns):
            out[f"eval/turn_{t + 1}/reward_mean"] = _mean(rewards[t])
            out[f"eval/turn_{t + 1}/expected_return"] = _mean(
                [sum(rewards[u][k] for u in range(t, turns)) for k in range(len(rewards[t]))])
        return out

    # --- training ------------------------------------------------------------------------------------------
    def updates_in_batch(self, batch: Sequence) -> int:
        return len(batch)

    def max_samples_per_item(self) -> int:
        """A tree's node samples per agent without early termination (docs/multiturn.md §2.3)."""
        a = self.args
        return max_nodes_per_tree(self.team.num_agents, a.num_generations, a.num_turns, a.joint_mode)

    def training_step(self, batch: list[tuple[int, dict]], batch_idx: int) -> None:
        task = self.task
        oracle = self.training_oracle(task)
        losses = []
        for window in self.update_windows(batch):
            trees = self.rollout_batch(window, task.formatters, oracle, task.external_transition, task.prompt_field)
            versions = list(self.policy_versions)  # every tree of the window was sampled by these weights
            for _, samples in trees:
                # docs/multiturn.md §2.9: group by node env_step (pre-order), agents in index order; drain ready agents
                # per group.
                for _, group in itertools.groupby(samples, key=lambda s: s.env_step):
                    ready = []
                    for s in group:
                        s.version = versions[s.agent]
                        self.rollout_buffers[s.agent].append(s)
                        if len(self.rollout_buffers[s.agent]) >= self.args.rollout_buffer_size and s.agent not in ready:
                            ready.append(s.agent)
                    losses += self.drain_agents(ready)
                self.updates_seen += 1
        if batch_idx + 1 >= self.trainer.num_training_batches:
            losses += self.flush()
        if losses:
            self.log("loss", sum(losses) / len(losses), prog_bar=True, logger=False, batch_size=1)
        self.log("env_step", float(self.env_step), prog_bar=True, logger=False, batch_size=1)

    def on_train_epoch_end(self) -> None:
        self.flush()  # normally empty already: the last training_step of the epoch flushes

    def flush(self) -> list[float]:
        """Drain every non-empty buffer (end of epoch)."""
        return self.drain_agents([agent for agent in range(self.team.num_agents) if self.rollout_buffers[agent]])

    def drain(self, agent: int) -> list[float]:
        """Update ``agent`` on its buffer: per turn (ascending), shuffled minibatches of train_batch_size."""
        return self.drain_agents([agent])

    def drain_agents(self, agents: Sequence[int]) -> list[float]:
        """:meth:`drain` each of ``agents`` (docs/multiturn.md §2.9) and return the minibatch losses, agent after agent.

        The shuffles are drawn first, agent after agent and turn after turn, from the one ``shuffle_rng``; the
        updates then run through :meth:`run_agent_updates` (at the same time where ``agent_overlap`` allows: the
        agents share nothing else, so the weights equal the agent-after-agent drain); the turn groups are logged
        last, in agent and turn order."""
        plans, staleness, version_of = [], [], {}
        for agent in agents:
            samples, self.rollout_buffers[agent] = self.rollout_buffers[agent], []
            staleness.append(_mean([self.policy_versions[agent] - s.version for s in samples]))
            version_of[agent] = self.policy_versions[agent]
            self.policy_versions[agent] += 1
            by_turn: dict[int, list[NodeSample]] = defaultdict(list)
            for s in samples:
                by_turn[s.turn].append(s)
            for turn in sorted(by_turn):
                self.shuffle_rng.shuffle(by_turn[turn])
            plans.append([(turn, by_turn[turn]) for turn in sorted(by_turn)])
        plan_of = dict(zip(agents, plans))
        done = self.run_agent_updates(
            agents, lambda agent, main: self._drain_plan(agent, plan_of[agent], main, version_of[agent]))
        losses = []
        for agent, plan, group_losses, stale in zip(agents, plans, done, staleness):
            for (turn, group), turn_losses in zip(plan, group_losses):
                losses += turn_losses
                self._log_group(agent, turn, group, turn_losses, stale)
        return losses

    def _drain_plan(self, agent: int, plan: Sequence[tuple[int, list[NodeSample]]], main: MainThread,
                    version: int) -> list[list[float]]:
        """The minibatch updates of one agent's drain, turn group after turn group: the losses per group. The
        first minibatch runs on the weights of ``version`` (before this drain's steps): its samples of that
        version are checked against the engine's log-probs (:meth:`minibatch_loss`)."""
        size = self.args.train_batch_size
        out = []
        for _, group in plan:
            losses = []
            for i in range(0, len(group), size):
                self._gap_version[agent] = version if not out and not losses else None
                losses.append(self._update(agent, group[i:i + size], main))
            out.append(losses)
        self._gap_version[agent] = None
        return out

    def minibatch_loss(self, agent: int, minibatch: Sequence[NodeSample]) -> torch.Tensor:
        """Mean over the node samples of their policy-gradient loss; one forward for all their rows."""
        prompts = [s.prompt_ids for s in minibatch for _ in s.completion_ids]
        comps = [c for s in minibatch for c in s.completion_ids]
        batch = completion_batch(prompts, comps, self.team.tokenizers[agent])
        batch = {k: v.to(self.agent_device(agent)) for k, v in batch.items()}
        with self.team.activate(agent) as model:
            logps, _ = scored_token_logps(model, batch)  # logits of the completion positions only
        self._check_logprob_gap(agent, minibatch, logps, batch["score_mask"])
        mask = batch["score_mask"].bool()
        total = logps.new_zeros(())
        row = 0
        for s in minibatch:
            k = len(s.completion_ids)
            adv = torch.tensor(s.advantages, dtype=logps.dtype, device=logps.device)
            total = total + policy_gradient_loss(logps[row:row + k], mask[row:row + k], adv)
            row += k
        return total / len(minibatch)

    def _check_logprob_gap(self, agent: int, minibatch: Sequence[NodeSample], logps: torch.Tensor,
                           score_mask: torch.Tensor) -> None:
        """On an update's first minibatch (the weights that sampled it): the engine's log-probs against the
        trainer's (:func:`~comlrl_lightning.engines.verify.check_logprob_gap`), kept for the log."""
        version = self._gap_version.get(agent)
        if version is None:
            return
        engine = [lp for s in minibatch for lp in (s.engine_logprobs or [None] * len(s.completion_ids))]
        versions = [s.version for s in minibatch for _ in s.completion_ids]
        gap = check_logprob_gap(logps, score_mask, engine, versions, version, self.args.logprob_gap_threshold,
                                agent, self.optimizer_steps, engine_of(self.team), self.team.models[agent])
        if gap is not None:
            self._logprob_gaps[agent] = gap

    def _update(self, agent: int, minibatch: Sequence[NodeSample], main: MainThread) -> float:
        """One AdamW step of ``agent`` on ``minibatch``; Lightning's part through ``main``
        (:meth:`~comlrl_lightning.modules.base.TeamModuleBase.run_agent_updates`)."""
        opt = self.optimizer_list()[agent]
        opt.zero_grad(set_to_none=True)
        loss = self.minibatch_loss(agent, minibatch)
        if not torch.isfinite(loss.detach()):
            raise FloatingPointError(
                f"{self.algorithm_name} loss of agent {agent} is {loss.item()} on a minibatch of turn "
                f"{minibatch[0].turn + 1} (env_step {minibatch[0].env_step}). Lower agent_learning_rate or check "
                "the rewards.")
        self.agent_backward(loss, main)
        self.agent_step(opt, main, agent)
        return float(loss.detach())

    def _step(self, optimizer: Any, scheduler_of: int | None) -> None:
        super()._step(optimizer, scheduler_of)
        self.optimizer_steps += 1

    def _log_group(self, agent: int, turn: int, group: Sequence[NodeSample], losses: Sequence[float],
                   staleness: float = 0.0) -> None:
        """One entry per (agent, turn group) per drain, gated by ``logging_steps`` on env_step
        (docs/multiturn.md §10.1)."""
        step = max(s.env_step for s in group)
        gate = self.args.logging_steps
        if not (gate <= 1 or self._last_logged_step is None or step - self._last_logged_step >= gate):
            return
        self._last_logged_step = step
        t = turn + 1
        lengths = [len(trim_completion(c, self.team.tokenizers[agent].eos_token_id,
                                       self.team.tokenizers[agent].pad_token_id))
                   for s in group for c in s.completion_ids]
        metrics = {
            f"turn_{t}/reward_mean": _mean([s.node_mean_reward for s in group]),
            f"turn_{t}/expected_return": _mean([s.node_mean_return for s in group]),
            f"train/agent{agent}/reward_std": _mean([s.reward_std for s in group]),
            f"train/agent{agent}/completions/mean_length": _mean(lengths),
            "train/loss": _mean(losses),
            f"train/agent{agent}/staleness": staleness,
            "env_step": float(self.env_step),
        }
        gap = self._logprob_gaps.pop(agent, None)
        if gap is not None:
            metrics[f"engine/agent_{agent}/logprob_gap"] = gap
        if self.reference is not None:
            kls = [k for s in group for k in (s.kls or [])]
            kl = _mean(kls) if kls else 0.0
            metrics[f"train/agent{agent}/kl"] = kl
            metrics[f"turn_{t}/reference_kl_mean"] = kl
            metrics[f"turn_{t}/reference_kl_penalty_mean"] = self.args.reference_kl_coef * kl
        if self._trainer is not None:
            # under DDP, the means over every rank's group (torchmetrics; docs/scaling.md, section 3)
            metrics = mean_across_ranks(metrics, len(group), world(self._trainer)[1], self.device, keep=("env_step",))
            log_metrics(self.trainer, metrics)

    # --- checkpoint ----------------------------------------------------------------------------------------
    def progress_state(self) -> dict[str, Any]:
        return {**super().progress_state(), "optimizer_steps": self.optimizer_steps,
                "policy_versions": list(self.policy_versions),
                "streams": [s.state_dict() for s in self.streams], "shuffle_rng": list(self.shuffle_rng.getstate())}

    def load_progress_state(self, state: dict[str, Any]) -> None:
        super().load_progress_state(state)
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
        self.policy_versions = [int(v) for v in state.get("policy_versions", self.policy_versions)]
        self.load_rank_state(state)

    def rank_state(self) -> dict[str, Any]:
        # the samples waiting for their agent's next update (a checkpoint inside an epoch keeps them; plain types)
        return {"buffers": [[dataclasses.asdict(s) for s in b] for b in self.rollout_buffers],
                **self.random_state(self.streams, self.shuffle_rng)}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        if "buffers" in state:
            self.rollout_buffers = [[NodeSample(**s) for s in b] for b in state["buffers"]]
        self.load_random_state(state, self.streams, self.shuffle_rng)


def check_transition(args: Any, transition: Any, algorithm: str = "MAGRPO") -> None:
    """Multi-turn needs an external transition (docs/multiturn.md §5); raise the upstream message otherwise."""
    if args.num_turns > 1 and transition is None:
        raise ValueError(f"Multi-turn {algorithm} requires an external_transition (num_turns={args.num_turns}). "
                         "Pass external_transition= (e.g. comlrl_lightning.multiturn.transitions.plain_transition) "
                         "or set num_turns=1.")
    if transition is not None and not callable(transition):
        raise ValueError(f"external_transition must be a callable; got {type(transition).__name__}.")


def _mean(values: Sequence[float]) -> float:
    values = list(values)
    return float(sum(values) / len(values)) if values else 0.0
