"""ActorCriticModule: IAC (a critic per actor) and MAAC (one centralised critic), manual optimization.

Per task item every agent samples ``num_generations`` completions per turn (exactly one in multi-turn);
the reward is called once per turn; critic values, and the reference KL when enabled, are recorded at
rollout time. After the whole episode each (agent, generation) trajectory gets one-step TD targets
``y_t = r̃_t + γ·V_old(h_{t+1})`` with no bootstrap after the last executed turn (horizon or early
termination), where r̃ = r − β·KL (:mod:`comlrl_lightning.multiturn.episodes`). Samples then go to per-agent
buffers; an agent whose buffer holds ``rollout_buffer_size`` samples is drained: per turn, advantages
A = y − V_old (z-normalised over the group), shuffled minibatches of ``train_batch_size``, an actor step on
−Â·log π(completion) (padding after EOS never counts) and a critic step on ``value_loss_coef``·(y − V)².
The rest of every buffer is flushed at epoch end (in the epoch's last training step, so those optimizer
steps count in ``global_step``). No policy changes between the turns of one episode.

Critics (:mod:`comlrl_lightning.nets.critics`): IAC separate critics read the agent's token ids (V: value at
the last prompt token; Q: at the last completion token); IAC attached heads sit on the actor's last hidden
states (one optimizer per actor trains both, with value clipping); the MAAC critic reads the joint text
"[Agent i] prompt_i" blocks (+ "[Joint Action]" blocks for Q) in agent 0's tokens.

Optimizers: one per actor (the ``optimizer`` factory, default AdamW at ``agent_learning_rate``), then
(IAC separate) one AdamW per critic or (MAAC) one for the shared critic at ``critic_learning_rate``; the
shared critic steps after every actor minibatch. ``trainer.global_step`` counts every optimizer step.
``env_step`` counts samples per agent (K per single-turn item, T′ per episode); ``updates_seen`` counts
training items (the evaluation schedule counts items).

Length: what is left here is the LightningModule alone (critic nets live in ``nets/critics.py``, the
episode arithmetic in ``multiturn/episodes.py``); the update loop and the batched rollout glue stay together
because both read the same per-agent buffers.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn

from comlrl_lightning.config import IACConfig, MAACConfig
from comlrl_lightning.devices import device_of, resolve_devices
from comlrl_lightning.engines import SampleRequest, engine_of
from comlrl_lightning.engines.verify import check_engine_version, check_logprob_gap
from comlrl_lightning.evaluation import EvalMetrics, balanced_evaluation, balanced_pass, register_passes, with_turn_mean
from comlrl_lightning.generation import Samples, SamplingStream
from comlrl_lightning.logging_utils import log_metrics
from comlrl_lightning.logprobs import build_scoring_batch, scored_token_logps, trim_completion
from comlrl_lightning.losses import policy_gradient_loss, td_advantages, value_loss
from comlrl_lightning.modules.base import TeamModuleBase, default_adamw
from comlrl_lightning.multiturn.episodes import EpisodeSample, first_prompt, run_episodes, turn_rewards, turn_summary
from comlrl_lightning.multiturn.transitions import call_transition, next_prompts
from comlrl_lightning.nets.critics import build_critics, joint_critic_text, right_pad
from comlrl_lightning.overlap import MainThread
from comlrl_lightning.protocols import RolloutTask, check_protocol
from comlrl_lightning.tiny import TINY_MODEL_NAME

#: Names of the balanced collectives of a sharded multi-turn evaluation (docs/scaling.md, "FSDP2"), per agent.
VALUES_PASS = "agent {}'s critic values (evaluation)"
KL_PASS = "agent {}'s reference KL (evaluation)"


class ActorCriticModule(TeamModuleBase):
    """IAC or MAAC, chosen by the type of ``args``.

    Args as :class:`~comlrl_lightning.modules.base.TeamModuleBase`, and:
        critic_model: the critic source (id, path or model object; one object is shared by the IAC critics'
            backbones, each with its own head). Default: the agents' source when it is a string.
        critics: explicit critic sources, N for IAC, 1 for MAAC.
        critic_model_name: a critic id used when ``critic_model`` and ``critics`` are absent (MARLHF's option).
        model_config: also ``critic_model_kwargs`` (critic load kwargs) and, for MAAC,
            ``critic_value_head_hidden_dim``.
        args: an :class:`~comlrl_lightning.config.IACConfig` (default) or
            :class:`~comlrl_lightning.config.MAACConfig`.
        metrics_callback: optional ``f(rollouts) -> dict`` logged unprefixed after every item.
        optimizer: the actors' optimizer factory; the critics keep AdamW with ``critic_learning_rate``.
        lr_scheduler: steps after each actor step.
    """

    def __init__(
        self,
        agent_model: str | None = TINY_MODEL_NAME,
        agents: Sequence[Any] | None = None,
        tokenizer: Any = None,
        critic_model: Any = None,
        critics: Sequence[Any] | None = None,
        critic_model_name: str | None = None,
        model_config: dict | None = None,
        lora: dict | None = None,
        args: IACConfig | MAACConfig | None = None,
        metrics_callback: Callable | str | None = None,
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
    ):
        super().__init__()
        self.args: IACConfig | MAACConfig = args if args is not None else IACConfig()
        if not isinstance(self.args, (IACConfig, MAACConfig)):
            raise TypeError(f"args must be an IACConfig or a MAACConfig; got {type(self.args).__name__}.")
        self.save_redacted_hyperparameters(ignore=["agents", "tokenizer", "critic_model", "critics", "metrics_callback",
                                          "optimizer", "lr_scheduler"])
        self.is_maac = isinstance(self.args, MAACConfig)
        self.method = "MAAC" if self.is_maac else "IAC"
        self.init_team(agent_model, agents, tokenizer, model_config, lora, optimizer, lr_scheduler)
        a, n = self.args, self.team.num_agents
        self.separate_critics = self.is_maac or bool(a.use_separate_critic)
        critic_dim = (model_config or {}).get("critic_value_head_hidden_dim") if self.is_maac \
            else a.critic_value_head_hidden_dim
        with torch.random.fork_rng(devices=[]):  # the value heads' initial weights are a function of `seed` alone
            torch.manual_seed(a.seed)
            built, heads, self.critic_names = build_critics(
                self.method, self.separate_critics, self.team, agent_model, agents, critic_model, critics,
                critic_model_name, model_config, critic_dim, None if self.is_maac else a.value_head_hidden_dim)
        self.critics, self.value_heads = nn.ModuleList(built), nn.ModuleList(heads)
        if isinstance(metrics_callback, str):
            from comlrl_lightning.data.sources import resolve_callable

            metrics_callback = resolve_callable(metrics_callback, "metrics_callback")
        if metrics_callback is not None and not callable(metrics_callback):
            raise ValueError(f"metrics_callback must be a callable or None; got {type(metrics_callback).__name__}.")
        self.metrics_callback = metrics_callback
        self.reference = None
        if a.reference_kl_enabled:
            from comlrl_lightning.reference import ReferencePolicies

            self.reference = ReferencePolicies(self.team, a.reference_devices)
        self.streams = self.rollout_streams(a.seed)
        self._rng = random.Random(a.seed)
        self.rollout_buffers: list[list[EpisodeSample]] = [[] for _ in range(n)]
        self.num_drains = 0
        self.policy_versions = [0] * n  # updates (buffer drains) of each agent so far: the version of its weights
        self._gap_version: dict[int, int | None] = {}  # per agent: the version its next minibatch checks, or None
        self._last_logged_env_step: int | None = None
        self.last_rollouts: list[EpisodeSample] = []
        self.formatters: list[Callable] | None = None
        self.oracle: Any = None
        self.external_transition: Callable | None = None

    # --- setup --------------------------------------------------------------------------------------------
    def bind_task(self, formatters: Sequence[Callable], oracle: Any, external_transition: Callable | None = None
                  ) -> None:
        """Set the per-agent formatters, the reward oracle and the transition (``setup`` takes them from the
        DataModule: ``formatters``, ``oracle``, ``external_transition``)."""
        if len(formatters) != self.team.num_agents:
            raise ValueError(f"Got {len(formatters)} formatters for {self.team.num_agents} agents.")
        if self.args.num_turns > 1 and external_transition is None:
            raise ValueError(f"Multi-turn {self.method} requires an external_transition (num_turns="
                             f"{self.args.num_turns}). Pass external_transition=... to the data module, or set "
                             "num_turns=1.")
        self.formatters, self.oracle, self.external_transition = list(formatters), oracle, external_transition

    def setup(self, stage: str) -> None:
        seed = self.rank_rollout_seed()
        if seed is not None:  # each rank its own rollout streams (docs/scaling.md)
            self.streams, self._rng = self.rollout_streams(seed), random.Random(seed)
        dm = self.trainer.datamodule
        if dm is None:
            raise ValueError(f"{self.method} needs a task data module with `formatters` and `oracle` "
                             "(comlrl_lightning.data.task.TaskDataModule).")
        check_protocol(dm, RolloutTask, self.method, "data module", "TaskDataModule")
        self.bind_task(dm.formatters, dm.oracle, dm.external_transition)

    def trainable_modules(self) -> list[nn.Module]:
        return [*super().trainable_modules(), *self.critics, *self.value_heads]

    def member_placement(self) -> list[tuple[nn.Module, torch.device]]:
        """The agents (base class), each attached value head with its agent, the critics on
        ``critic_devices`` (MAAC: its one critic)."""
        placement = super().member_placement()
        if not placement:
            return placement
        agent_devices = [device for _, device in placement]
        placement += list(zip(self.value_heads, agent_devices))
        if len(self.critics):
            spec = self.args.critic_devices if self.args.critic_devices is not None else self.args.agent_devices
            placement += list(zip(self.critics, resolve_devices(spec, len(self.critics), "critic_devices")))
        return placement

    def agent_parameters(self, i: int) -> list[nn.Parameter]:
        heads = list(self.value_heads[i].parameters()) if self.value_heads else []
        return super().agent_parameters(i) + heads

    def extra_optimizers(self) -> list[torch.optim.Optimizer]:
        return [default_adamw(c.trainable_parameters(), self.args.critic_learning_rate) for c in self.critics]

    # --- forward passes -----------------------------------------------------------------------------------
    def _ids(self, i: int) -> tuple[int, int]:
        tok = self.team.tokenizers[i]
        eos = tok.eos_token_id if tok.eos_token_id is not None else tok.pad_token_id
        return tok.pad_token_id, eos

    def _sequence_batch(self, i: int, samples: Sequence[EpisodeSample]) -> tuple[dict, torch.Tensor]:
        """Right-padded [prompt ; completion] rows of agent i with the completion mask, and the critic read
        position of each row (last prompt token for V, last completion token for Q)."""
        pad, eos = self._ids(i)
        prompts = [s["prompt_ids"] for s in samples]
        comps = [trim_completion(s["completion_ids"], eos, pad) for s in samples]
        batch = build_scoring_batch(prompts, comps, pad, drop_last=False, eos_id=eos)
        q = self.args.critic_type == "q"
        pos = torch.tensor([len(p) - 1 + (len(c) if q else 0) for p, c in zip(prompts, comps)])
        device = self.agent_device(i)
        return {k: v.to(device) for k, v in batch.items()}, pos.to(device)

    def _actor_forward(self, i: int, batch: dict, with_values: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token log-probs ``[R, L]`` of agent i (and its attached head's values ``[R, L]``)."""
        with self.team.activate(i) as model:
            logps, out = scored_token_logps(model, batch, output_hidden_states=with_values)
        values = self.value_heads[i](out.hidden_states[-1]) if with_values else None
        return logps, values

    def _values(self, i: int, samples: Sequence[EpisodeSample]) -> torch.Tensor:
        """Critic values of agent i's samples (gradients follow the caller's grad mode), ``[R]``."""
        if self.is_maac:
            ids, mask = right_pad([s.critic_ids for s in samples], self.team.tokenizers[0].pad_token_id)
            device = device_of(self.critics[0], self.device)
            pos = torch.tensor([len(s.critic_ids) - 1 for s in samples], device=device)
            values = self.critics[0](ids.to(device), mask.to(device))
        else:
            batch, pos = self._sequence_batch(i, samples)
            if self.value_heads:
                values = self._actor_forward(i, batch, with_values=True)[1]
            else:
                device = device_of(self.critics[i], self.device)
                pos = pos.to(device)
                values = self.critics[i](batch["input_ids"].to(device), batch["attention_mask"].to(device))
        return values.gather(1, pos.unsqueeze(1)).squeeze(1).to(self.device)

    @torch.no_grad()
    def _turn_values(self, turn_samples: list[list[EpisodeSample]]) -> list[list[float]]:
        """Rollout-time critic values V_old (or Q_old) of one turn, ``[agent][generation]``; in a sharded evaluation
        each agent's pass is a balanced collective (:func:`~comlrl_lightning.evaluation.balanced_pass`)."""
        return [balanced_pass(self, VALUES_PASS.format(i), self._value_members(i),
                              lambda i=i, s=s: self._values(i, s).float().tolist()) for i, s in enumerate(turn_samples)]

    def _value_members(self, i: int) -> list[nn.Module]:
        """The members agent i's critic values run through: MAAC's critic, IAC's own critic, or agent i's model and
        value head."""
        if self.is_maac:
            return [self.critics[0]]
        return [self.critics[i]] if self.critics else [self.team.models[i], self.value_heads[i]]

    @torch.no_grad()
    def _turn_kls(self, turn_samples: list[list[EpisodeSample]]) -> list[list[float]]:
        from comlrl_lightning.reference import sequence_kl

        def kls(i: int, samples: list[EpisodeSample]) -> list[float]:
            batch, _ = self._sequence_batch(i, samples)
            policy = self._actor_forward(i, batch, with_values=False)[0]
            ref = self.reference.token_logps(i, batch)
            return sequence_kl(policy, ref, batch["score_mask"]).float().tolist()

        return [balanced_pass(self, KL_PASS.format(i), self._kl_members(i),
                              lambda i=i, s=s: kls(i, s)) for i, s in enumerate(turn_samples)]

    def _kl_members(self, i: int) -> list[nn.Module]:
        """The members agent i's reference KL runs through: its model and its frozen copy (none for LoRA agents)."""
        return [self.team.models[i], self.reference.model_for(i)]

    # --- rollout ------------------------------------------------------------------------------------------
    def collect(self, item: dict, item_index: Any = 0, num_generations: int | None = None, oracle: Any = None
                ) -> list[EpisodeSample]:
        """Roll out one task item (one episode); returns every sample, with TD targets set.
        ``oracle`` overrides the bound task oracle for this rollout (training uses ``train_oracle``)."""
        return self.collect_batch([(item_index, item)], num_generations, oracle)[0]

    def collect_batch(self, entries: Sequence[tuple[Any, dict]], num_generations: int | None = None,
                      oracle: Any = None) -> list[list[EpisodeSample]]:
        """Roll out the episodes of ``(item_index, item)`` entries in lockstep: per turn one batched
        ``generate`` per agent over every running episode; returns per entry its samples (as :meth:`collect`)."""
        if self.formatters is None or self.oracle is None:
            raise RuntimeError("No task bound: call bind_task(formatters, oracle, transition) or fit with a "
                               "TaskDataModule.")
        a, n = self.args, self.team.num_agents
        k = a.num_generations if num_generations is None else num_generations
        oracle = self.oracle if oracle is None else oracle
        settings = self.sampling_settings()
        where = [f"task item {index}" for index, _ in entries]
        tok0 = self.team.tokenizers[0]

        def draws(j: int, out: Samples) -> list[tuple]:  # (prompt ids, K completions, K texts, K engine log-probs)
            check_engine_version(engine_of(self.team), j, out, self.trainer.global_step if self._trainer else 0)
            return list(zip(out.prompt_ids, out.completion_ids, out.texts, out.logprobs or [None] * len(out.texts)))

        def sample(j: int, t: int, prompts: list[str]):
            return draws(j, engine_of(self.team).sample(j, prompts, k, settings, self.streams[j]))

        def sample_team(t: int, prompts: list[list[str]]):  # one engine call per turn for every agent
            requests = [SampleRequest(j, p, k, self.streams[j]) for j, p in enumerate(prompts)]
            return [draws(j, o) for j, o in enumerate(engine_of(self.team).sample_many(requests, settings))]

        def transition(e: int, previous: list[str], p_hist: list, r_hist: list, t: int) -> list[str]:
            index, item = entries[e]
            external = call_transition(self.external_transition, item.get("prompt", ""), previous, n, p_hist, r_hist,
                                       turn=t, branch=index)
            return next_prompts(external, item, self.formatters, a.external_prompt_passthrough)

        def reward(e: int, prompts: list[str], texts: list[list[str]], t: int):
            return turn_rewards(oracle, prompts, texts, entries[e][1], f"{where[e]}, turn {t + 1}", n, k, self.method)

        def critic_ids(prompts: list[str], acts: list[str]) -> list[int]:  # MAAC: the joint critic input
            return tok0(joint_critic_text(prompts, acts if a.critic_type == "q" else None),
                        truncation=True)["input_ids"]

        return run_episodes(
            n, k, a.num_turns, [[first_prompt(self.formatters[j], item, j, where[e]) for j in range(n)]
                                for e, (_, item) in enumerate(entries)], sample,
            reward=reward, values=lambda turn: self._turn_values(turn), discount=a.discount, transition=transition,
            kls=(lambda turn: self._turn_kls(turn)) if self.reference is not None else None,
            kl_coef=a.reference_kl_coef, critic_ids=critic_ids if self.is_maac else None,
            early_termination_threshold=a.early_termination_threshold, items=[index for index, _ in entries],
            sample_team_level=sample_team)

    def _kl_coef(self) -> float | None:
        return self.args.reference_kl_coef if self.reference is not None else None

    def evaluate(self, items: Sequence[dict], task: Any, seed: int = 12345, samples_per_item: int = 1) -> dict:
        """Single turn: the base's evaluation. Multi-turn: :meth:`evaluate_turns` (one path per item, scored
        with the bound task oracle), ``eval/reward_mean`` = the mean immediate reward over the turns."""
        if self.args.num_turns > 1:  # sharded agents: a balanced round on every rank, its passes balanced too
            from comlrl_lightning.sharding import team_is_sharded

            if team_is_sharded(self):  # every rank registers every pass here, before any rank may skip one
                n = self.team.num_agents
                register_passes(self, {VALUES_PASS.format(i): self._value_members(i) for i in range(n)})
                if self.reference is not None:
                    register_passes(self, {KL_PASS.format(i): self._kl_members(i) for i in range(n)})
            metrics = balanced_evaluation(self, lambda: self.evaluate_turns(items, seed), self.evaluation_where())
            return with_turn_mean(metrics, self.args.num_turns)
        return super().evaluate(items, task, seed, samples_per_item)

    @torch.no_grad()
    def evaluate_turns(self, items: Sequence[dict], seed: int = 12345) -> dict[str, float]:
        """One rollout per item with one sample per agent, early termination and KL shaping included, on
        fresh seeded streams (training's streams are untouched).

        Returns ``eval/turn_{t}/reward_mean`` and ``eval/turn_{t}/expected_return`` (means over every agent's
        sample of turn t), the KL means when enabled, and ``eval/reward_mean`` (= turn 1's), as an
        :class:`~comlrl_lightning.evaluation.EvalMetrics` that also holds what was sampled for CoMLRL's
        ``eval_logger``: ``completions[agent][item][turn]`` (an episode ended early has fewer turns).
        """
        n = self.team.num_agents
        saved = self.streams
        self.streams = [SamplingStream(seed + 7919 * i) for i in range(n)]
        per_turn: dict[int, list[EpisodeSample]] = {}
        completions: list[list[list[str]]] = [[[] for _ in items] for _ in range(n)]
        try:
            episodes = self.collect_batch([(f"eval {k}", item) for k, item in enumerate(items)], num_generations=1)
            for k, episode in enumerate(episodes):  # one episode per item, in order
                for s in sorted(episode, key=lambda s: (s.turn, s.agent)):
                    per_turn.setdefault(s.turn + 1, []).append(s)
                    # the sampled ids were trimmed at the first pad token: decoding them gives the sampled text
                    completions[s.agent][k].append(
                        self.team.tokenizers[s.agent].decode(s.completion_ids, skip_special_tokens=True))
        finally:
            self.streams = saved
        out = EvalMetrics()
        out.completions, out.batch_items = completions, list(items)
        out.raw_prompts = [item.get("prompt", "") if isinstance(item, dict) else "" for item in items]
        for t, samples in sorted(per_turn.items()):
            out.update({f"eval/turn_{t}/{key}": v for key, v in turn_summary(samples, self._kl_coef()).items()})
        if out:
            out["eval/reward_mean"] = out["eval/turn_1/reward_mean"]
        return out

    # --- training -----------------------------------------------------------------------------------------
    def updates_in_batch(self, batch: Any) -> int:
        return len(batch) if isinstance(batch, list) else 1

    def max_samples_per_item(self) -> int:
        return self.args.num_generations * self.args.num_turns  # K completions per turn (K = 1 when multi-turn)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        """Roll out the batch's items window by window (:func:`~comlrl_lightning.multiturn.tree.update_windows`),
        then, item after item as with one item per step, add each item's samples to the buffers and drain the agents
        whose buffer is full; the epoch's last item flushes every buffer."""
        items = batch if isinstance(batch, list) else [batch]
        a, n = self.args, self.team.num_agents
        entries = [entry if isinstance(entry, tuple) else (batch_idx, entry) for entry in items]
        last_batch = batch_idx + 1 >= self.trainer.num_training_batches
        done = 0
        for window in self.update_windows(entries):
            versions = list(self.policy_versions)  # every episode of the window was sampled by these weights
            for rollouts in self.collect_batch(window, oracle=self.train_oracle):
                done += 1
                self.last_rollouts = rollouts
                self.env_step += len(rollouts) // n
                for s in rollouts:
                    s.version = versions[s.agent]
                    self.rollout_buffers[s.agent].append(s)
                if self.metrics_callback is not None:
                    clean = {}
                    for key, v in (self.metrics_callback(rollouts) or {}).items():
                        try:
                            clean[key] = float(v)
                        except (TypeError, ValueError):
                            continue
                    self._emit(clean, gate=False)
                self.log("reward", sum(s.reward for s in rollouts) / len(rollouts), prog_bar=True, logger=False,
                         batch_size=1)
                ready = [i for i in range(n) if len(self.rollout_buffers[i]) >= a.rollout_buffer_size]
                if last_batch and done == len(entries):  # the epoch's last item: flush everything
                    ready = [i for i in range(n) if self.rollout_buffers[i]]
                if ready:
                    self._drain(ready)
                self.updates_seen += 1

    def on_train_epoch_end(self) -> None:
        # Normally flushed by the epoch's last training_step (so its optimizer steps count in global_step);
        # this catches an epoch cut short (max_steps) or a dataloader without a length.
        pending = [i for i in range(self.team.num_agents) if self.rollout_buffers[i]]
        if pending:
            self._drain(pending)

    def _drain(self, agents: Sequence[int]) -> None:
        """Update each listed agent on its whole buffer, turn by turn (ascending), then log. The minibatch orders
        are drawn first (agent after agent, turn after turn, from the one ``_rng``); the agents' updates then run
        through :meth:`run_agent_updates` (at the same time where ``agent_overlap`` allows; MAAC's one critic keeps
        them one after another)."""
        plans, staleness = [], {}
        for i in agents:
            samples, self.rollout_buffers[i] = self.rollout_buffers[i], []
            staleness[f"train/agent{i}/staleness"] = sum(self.policy_versions[i] - s.version for s in samples) / len(
                samples)
            self._gap_version[i] = self.policy_versions[i]  # checked on the first minibatch (_update)
            self.policy_versions[i] += 1
            turns = []
            for t in sorted({s.turn for s in samples}):
                group = [s for s in samples if s.turn == t]
                order = list(range(len(group)))
                self._rng.shuffle(order)
                turns.append((group, order))
            plans.append(turns)
        plan_of = dict(zip(agents, plans))
        done = self.run_agent_updates(
            agents, lambda i, main: [self._update(i, group, order, main) for group, order in plan_of[i]],
            members=[self._update_members(i) for i in agents])
        metrics: dict[str, float] = dict(staleness)
        for turns in done:
            for out in turns:
                metrics.update(out)
        self.num_drains += 1
        metrics["env_step"] = float(self.env_step)
        self._emit(metrics, gate=True)
        losses = [v for k, v in metrics.items() if k.endswith("_loss")]
        if losses and self._trainer is not None and self.trainer.training:
            # the progress bar's "loss": mean of the actor and value losses of this drain
            self.log("loss", sum(losses) / len(losses), prog_bar=True, logger=False, batch_size=1)

    def _update_members(self, i: int) -> list[nn.Module]:
        """What agent i's update trains: its model, its value head or its critic (MAAC: the one shared critic)."""
        members = [self.team.models[i]]
        if self.value_heads:
            members.append(self.value_heads[i])
        elif len(self.critics):
            members.append(self.critics[0 if self.is_maac else i])
        return members

    def _update(self, i: int, samples: list[EpisodeSample], order: list[int], main: MainThread) -> dict[str, float]:
        """Agent i's minibatch updates on one turn's samples, in ``order`` (drawn by :meth:`_drain`); Lightning's
        part through ``main`` (:meth:`~comlrl_lightning.modules.base.TeamModuleBase.run_agent_updates`). Returns the
        turn's metrics."""
        a = self.args
        opts = self.optimizer_list()
        actor_opt, critic_opts = opts[i], opts[self.team.num_agents:]
        targets = torch.tensor([s.target for s in samples], dtype=torch.float32, device=self.device)
        old = torch.tensor([s.old_value for s in samples], dtype=torch.float32, device=self.device)
        adv = td_advantages(targets, old, normalize=a.advantage_normalization)
        self._check_finite(i, "advantage", adv)
        actor_losses, value_losses, gaps = [], [], {}
        for start in range(0, len(order), a.train_batch_size):
            idx = order[start:start + a.train_batch_size]
            mb = [samples[k] for k in idx]
            idx_t = torch.tensor(idx, device=self.device)
            y, v_old, adv_mb = targets[idx_t], old[idx_t], adv[idx_t]
            batch, pos = self._sequence_batch(i, mb)
            actor_opt.zero_grad(set_to_none=True)
            logps, head_values = self._actor_forward(i, batch, with_values=bool(self.value_heads))
            version, self._gap_version[i] = self._gap_version.get(i), None
            if version is not None:  # the update's first minibatch: the weights that sampled it (docs/engines.md)
                gap = check_logprob_gap(logps, batch["score_mask"], [s.engine_logprobs for s in mb],
                                        [s.version for s in mb], version, a.logprob_gap_threshold, i,
                                        self.trainer.global_step, engine_of(self.team), self.team.models[i])
                if gap is not None:
                    gaps[f"engine/agent_{i}/logprob_gap"] = gap
            actor_loss = policy_gradient_loss(logps, batch["score_mask"], adv_mb.to(logps.device))
            self._check_finite(i, "actor loss", actor_loss)
            if self.value_heads:  # IAC attached head: one step on actor + critic loss, with value clipping
                values = head_values.gather(1, pos.unsqueeze(1)).squeeze(1).to(self.device)
                vloss = value_loss(values, y, v_old, a.value_clip_range, a.value_loss_coef).mean()
                self._check_finite(i, "value loss", vloss)
                self.agent_backward(actor_loss.to(self.device) + vloss, main)
                self.agent_step(actor_opt, main, i)
            else:
                self.agent_backward(actor_loss, main)
                self.agent_step(actor_opt, main, i)
                copt = critic_opts[0 if self.is_maac else i]
                copt.zero_grad(set_to_none=True)
                vloss = value_loss(self._values(i, mb), y, coef=a.value_loss_coef).mean()
                self._check_finite(i, "value loss", vloss)
                self.agent_backward(vloss, main)
                self.agent_step(copt, main)
            actor_losses.append(float(actor_loss.detach()))
            value_losses.append(float(vloss.detach()))
        pad, eos = self._ids(i)
        summary = turn_summary(samples, self._kl_coef())
        out = {f"turn_{samples[0].turn + 1}/{key}": v for key, v in summary.items()}
        out.update(gaps)
        out[f"train/agent{i}/actor_loss"] = sum(actor_losses) / len(actor_losses)
        out["train/critic/value_loss" if self.is_maac else f"train/agent{i}/value_loss"] = \
            sum(value_losses) / len(value_losses)
        lengths = [len(trim_completion(s.completion_ids, eos, pad)) for s in samples]
        out[f"train/agent{i}/completions/mean_length"] = sum(lengths) / len(lengths)
        if self.reference is not None:
            out[f"train/agent{i}/kl"] = summary["reference_kl_mean"]
        return out

    def _check_finite(self, i: int, what: str, value: torch.Tensor) -> None:
        if not torch.isfinite(value.detach()).all():
            raise FloatingPointError(f"{self.method}: agent {i}'s {what} is not finite ({value.detach().tolist()}). "
                                     "Check the rewards' scale and lower the learning rates.")

    def _emit(self, metrics: dict[str, float], gate: bool) -> None:
        """Log at the current global step, with the env-step gate (``logging_steps``) for train metrics."""
        if not metrics or self._trainer is None:
            return
        if gate:
            last = self._last_logged_env_step
            if self.args.logging_steps > 1 and last is not None and self.env_step - last < self.args.logging_steps:
                return
            self._last_logged_env_step = self.env_step
        log_metrics(self.trainer, metrics)

    # --- checkpoint and export ----------------------------------------------------------------------------
    def progress_state(self) -> dict[str, Any]:
        return {**super().progress_state(), "num_drains": self.num_drains,
                "policy_versions": list(self.policy_versions), **self.rank_state()}

    def load_progress_state(self, state: dict[str, Any]) -> None:
        super().load_progress_state(state)
        self.num_drains = int(state.get("num_drains", 0))
        self.policy_versions = [int(v) for v in state.get("policy_versions", self.policy_versions)]
        self.load_rank_state(state)

    def rank_state(self) -> dict[str, Any]:
        return {"buffers": [[s.as_dict() for s in b] for b in self.rollout_buffers],
                **self.random_state(self.streams, self._rng)}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        if "buffers" in state:
            self.rollout_buffers = [[EpisodeSample.from_dict(s) for s in b] for b in state["buffers"]]
        self.load_random_state(state, self.streams, self._rng)

    def save_agents(self, output_dir: str) -> list[str]:
        """``output_dir/agent_{i}/`` per agent (+ ``value_head.pt`` or ``critic/``); MAAC: ``output_dir/critic/``."""
        paths = super().save_agents(output_dir)
        out = Path(output_dir)
        for i, head in enumerate(self.value_heads):
            torch.save(head.state_dict(), out / f"agent_{i}" / "value_head.pt")
        for k, critic in enumerate(self.critics):
            target = out / "critic" if self.is_maac else out / f"agent_{k}" / "critic"
            target.mkdir(parents=True, exist_ok=True)
            critic.model.save_pretrained(str(target))
            torch.save(critic.value_head.state_dict(), target / "value_head.pt")
        return paths


class IACModule(ActorCriticModule):
    """:class:`ActorCriticModule` with an :class:`~comlrl_lightning.config.IACConfig` (for YAML configs)."""

    def __init__(self, agent_model: str | None = TINY_MODEL_NAME, agents: Sequence[Any] | None = None,
                 tokenizer: Any = None, critic_model: Any = None, critics: Sequence[Any] | None = None,
                 critic_model_name: str | None = None, model_config: dict | None = None, lora: dict | None = None,
                 args: IACConfig | None = None, metrics_callback: Callable | str | None = None,
                 optimizer: OptimizerCallable | None = None, lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__(agent_model, agents, tokenizer, critic_model, critics, critic_model_name, model_config, lora,
                         args if args is not None else IACConfig(), metrics_callback, optimizer, lr_scheduler)


class MAACModule(ActorCriticModule):
    """:class:`ActorCriticModule` with a :class:`~comlrl_lightning.config.MAACConfig` (for YAML configs)."""

    def __init__(self, agent_model: str | None = TINY_MODEL_NAME, agents: Sequence[Any] | None = None,
                 tokenizer: Any = None, critic_model: Any = None, critics: Sequence[Any] | None = None,
                 critic_model_name: str | None = None, model_config: dict | None = None, lora: dict | None = None,
                 args: MAACConfig | None = None, metrics_callback: Callable | str | None = None,
                 optimizer: OptimizerCallable | None = None, lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__(agent_model, agents, tokenizer, critic_model, critics, critic_model_name, model_config, lora,
                         args if args is not None else MAACConfig(), metrics_callback, optimizer, lr_scheduler)
