"""ActorCriticModule: IAC (a critic per actor) and MAAC (one centralised critic), manual optimization.

Per task item (spec multiturn.md §4.3) every agent samples ``num_generations`` completions per turn
(exactly one in multi-turn); the reward is called once per turn; critic values, and the reference KL when
enabled, are recorded at rollout time. After the whole episode each (agent, generation) trajectory gets
one-step TD targets ``y_t = r̃_t + γ·V_old(h_{t+1})`` with no bootstrap after the last executed turn
(horizon or early termination), where r̃ = r − β·KL. Samples then go to per-agent buffers; an agent whose
buffer holds ``rollout_buffer_size`` samples is drained (§4.4): per turn, advantages A = y − V_old
(z-normalised over the group), shuffled minibatches of ``train_batch_size``, an actor step on
−Â·log π(completion) (padding after EOS never counts, decision 4) and a critic step on
``value_loss_coef``·(y − V)². The rest of every buffer is flushed at epoch end (in the epoch's last
training step, so those optimizer steps count in ``global_step``). No policy changes between the turns of
one episode: updates happen only after an episode is collected.

Critics are value heads on causal-LM backbones (§4.1): IAC separate critics read the agent's token ids
(V: value at the last prompt token; Q: at the last completion token); IAC attached heads sit on the
actor's last hidden states (one optimizer per actor trains both, with value clipping); the MAAC critic
reads the joint text "[Agent i] prompt_i" blocks (+ "[Joint Action]" blocks for Q) in agent 0's tokens.

Optimizers: one AdamW per actor, then (IAC separate) one per critic or (MAAC) one for the shared critic,
which steps after every actor minibatch as upstream. ``trainer.global_step`` counts every optimizer step.
``env_step`` counts samples per agent (K per single-turn item, T′ per episode); ``updates_seen`` counts
training items (the evaluation schedule counts items, as upstream's AC ``eval_interval``).
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn

from comlrl_lightning.agents import AgentTeam, build_agents, load_model, model_name_of
from comlrl_lightning.callbacks.logging_utils import log_metrics
from comlrl_lightning.config import IACConfig, MAACConfig
from comlrl_lightning.generation import SamplingSettings, SamplingStream, sample_completions
from comlrl_lightning.logprobs import build_scoring_batch, token_logps, trim_completion
from comlrl_lightning.losses import policy_gradient_loss, td_advantages, td_targets, value_loss
from comlrl_lightning.rewards import RewardError, call_reward_function
from comlrl_lightning.tiny import TINY_MODEL_NAME

# ``args`` is saved with the hyper-parameters; Lightning loads checkpoints with ``weights_only=True``.
torch.serialization.add_safe_globals([IACConfig, MAACConfig])

# --------------------------------------------------------------------------------------------------
# Critic models (§4.1)
# --------------------------------------------------------------------------------------------------


def hidden_size_of(model: nn.Module) -> int:
    """Hidden width of a causal LM (``config.hidden_size`` or ``config.n_embd``)."""
    cfg = getattr(model, "config", None)
    for attr in ("hidden_size", "n_embd"):
        value = getattr(cfg, attr, None)
        if value:
            return int(value)
    raise ValueError(f"Cannot attach a value head to {type(model).__name__}: its config has neither hidden_size "
                     "nor n_embd.")


class ValueHead(nn.Module):
    """Optional Linear(H→h) + Tanh, then Linear(→1); N(0, 0.02) weights, zero bias. ``[B, L, H] → [B, L]``."""

    def __init__(self, hidden_size: int, hidden_dim: int | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        layers: list[nn.Module] = []
        width = hidden_size
        if hidden_dim:
            layers += [nn.Linear(hidden_size, hidden_dim), nn.Tanh()]
            width = hidden_dim
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)
        for m in self.net:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        if dtype is not None:
            self.to(dtype)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden.to(self.net[0].weight.dtype)).squeeze(-1).float()


def _param_dtype(model: nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


class ValueCritic(nn.Module):
    """A causal-LM backbone with a value head: the value at every position, ``[B, L]``.

    Only the transformer body runs (``model.base_model`` when it is a distinct submodule), so the LM head
    costs nothing and an untied LM head stays out of the critic's optimizer.
    """

    def __init__(self, model: nn.Module, hidden_dim: int | None = None):
        super().__init__()
        self.model = model
        self.value_head = ValueHead(hidden_size_of(model), hidden_dim, _param_dtype(model))

    def _body(self) -> nn.Module | None:
        from transformers import PreTrainedModel

        body = getattr(self.model, "base_model", None)
        plain = isinstance(self.model, PreTrainedModel) and isinstance(body, PreTrainedModel)
        return body if plain and body is not self.model else None

    def trainable_parameters(self) -> list[nn.Parameter]:
        body = self._body() or self.model
        params = [p for p in body.parameters() if p.requires_grad] + list(self.value_head.parameters())
        return list({id(p): p for p in params}.values())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        body = self._body()
        if body is not None:
            hidden = body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        else:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                             output_hidden_states=True)
            hidden = out.hidden_states[-1]
        return self.value_head(hidden)


def resolve_critic_sources(critic_model: Any, critics: Sequence[Any] | None, critic_model_name: str | None,
                           agent_model: Any, agents: Sequence[Any] | None, count: int, method: str) -> list[Any]:
    """Critic sources (preference.md §9.2–9.3): ``critics`` → ``critic_model`` → ``critic_model_name`` → the
    agents' source when it is a string (IAC: agent i's string for critic i)."""
    where = "for MAAC" if method == "MAAC" else "when use_separate_critic=True"
    if critics is not None:
        critics = list(critics)
        if len(critics) != count:
            what = "1 critic" if method == "MAAC" else f"num_agents ({count})"
            raise ValueError(f"critics length ({len(critics)}) must match {what}. Pass exactly {count} critic(s) "
                             f"{where}.")
        if any(c is None for c in critics):
            raise ValueError("critics entries must be non-null.")
        return critics
    source = critic_model if critic_model is not None else critic_model_name
    if source is not None:
        return [source] * count
    if agents is None and isinstance(agent_model, str):
        return [agent_model] * count
    if agents is not None and all(isinstance(a, str) for a in agents):
        if count == len(agents):
            return list(agents)
        if len(set(agents)) == 1:
            return [agents[0]] * count
    raise ValueError(
        f"Either critic_model or critics must be provided {where}: the agents are model objects (or differing "
        "ids), so no critic can be derived from them. Pass critic_model='<hub id or local path>' (e.g. the "
        f"agents' checkpoint, or {TINY_MODEL_NAME!r}), critic_model_name=..., or critics=[...]."
    )


def _critic_load_config(model_config: dict | None) -> dict:
    cfg = {k: v for k, v in dict(model_config or {}).items()
           if k not in ("model_kwargs", "critic_model_kwargs", "special_tokens", "critic_value_head_hidden_dim")}
    cfg["model_kwargs"] = dict((model_config or {}).get("critic_model_kwargs") or {})
    return cfg


def _load_critic_backbones(sources: list[Any], model_config: dict | None) -> list[nn.Module]:
    out = []
    for s in sources:
        if isinstance(s, str):
            out.append(load_model(s, _critic_load_config(model_config)))
        elif isinstance(s, nn.Module):
            out.append(s)
        else:
            raise TypeError(f"critic sources must be model ids, paths or torch modules; got {type(s).__name__}.")
    for m in out:
        m.train()
    return out


# --------------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------------


def joint_critic_text(prompts: Sequence[str], completions: Sequence[str] | None = None) -> str:
    """MAAC critic input (§4.2): "[Agent i] prompt_i" blocks; for Q also "[Joint Action]" and the actions."""
    blocks = [f"[Agent {i}] {p}" for i, p in enumerate(prompts)]
    if completions is not None:
        blocks.append("[Joint Action]")
        blocks += [f"[Agent {i} action]\n{c}" for i, c in enumerate(completions)]
    return "\n\n".join(blocks)


def _declares(fn: Callable, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _right_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, r in enumerate(rows):
        ids[k, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[k, : len(r)] = 1
    return ids, mask


# --------------------------------------------------------------------------------------------------
# The module
# --------------------------------------------------------------------------------------------------


class ActorCriticModule(L.LightningModule):
    """IAC or MAAC (spec multiturn.md §4), chosen by the type of ``args``.

    Args:
        agent_model: one hub id / local path / ``embedded:tiny`` for homogeneous agents.
        agents: a list of ids, paths or model objects (overrides ``agent_model``).
        tokenizer: one tokenizer or one per agent (required with model objects).
        critic_model: the critic source (id, path or model object; one object is shared by the IAC critics'
            backbones, each with its own head). Default: the agents' source when it is a string.
        critics: explicit critic sources, N for IAC, 1 for MAAC.
        critic_model_name: a critic id used when ``critic_model`` and ``critics`` are absent (MARLHF's option).
        model_config: load kwargs (``dtype``, ``attn_implementation``, ``model_kwargs``,
            ``critic_model_kwargs``, ``special_tokens``; MAAC: ``critic_value_head_hidden_dim``).
        lora: peft LoraConfig kwargs for the actors (one frozen base, one adapter per agent).
        args: an :class:`~comlrl_lightning.config.IACConfig` (default) or
            :class:`~comlrl_lightning.config.MAACConfig`.
        metrics_callback: optional ``f(rollouts) -> dict`` logged unprefixed after every item.
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
    ):
        super().__init__()
        self.automatic_optimization = False
        self.args = args if args is not None else IACConfig()
        if not isinstance(self.args, (IACConfig, MAACConfig)):
            raise TypeError(f"args must be an IACConfig or a MAACConfig; got {type(self.args).__name__}.")
        self.save_hyperparameters(ignore=["agents", "tokenizer", "critic_model", "critics", "metrics_callback"])
        self.is_maac = isinstance(self.args, MAACConfig)
        self.method = "MAAC" if self.is_maac else "IAC"
        a = self.args
        self.team: AgentTeam = build_agents(
            agent_model=agent_model if agents is None else None, agents=agents, num_agents=a.num_agents,
            tokenizer=tokenizer, model_config=model_config, lora=lora,
        )
        n = self.team.num_agents
        if n != a.num_agents:
            raise ValueError(f"args.num_agents={a.num_agents} but {n} agents were given. Set num_agents={n}.")
        self.models = nn.ModuleList(self.team.unique_models())
        self.separate_critics = self.is_maac or bool(a.use_separate_critic)
        self.critics = nn.ModuleList()
        self.value_heads = nn.ModuleList()
        if self.is_maac or a.use_separate_critic:
            count = 1 if self.is_maac else n
            sources = resolve_critic_sources(critic_model, critics, critic_model_name, agent_model, agents, count,
                                             self.method)
            backbones = _load_critic_backbones(sources, model_config)
            dim = (model_config or {}).get("critic_value_head_hidden_dim") if self.is_maac \
                else a.critic_value_head_hidden_dim
            for k, b in enumerate(backbones):
                self._check_critic_vocab(b, self.team.tokenizers[k if not self.is_maac else 0], k)
                self.critics.append(ValueCritic(b, dim))
            self.critic_names = [s if isinstance(s, str) else model_name_of(s) for s in sources]
        else:
            if critic_model is not None or critics is not None or critic_model_name is not None:
                raise ValueError("critics can only be provided when use_separate_critic=True (the value heads sit "
                                 "on the actors). Drop critic_model/critics or set use_separate_critic=True.")
            for m in self.team.models:
                self.value_heads.append(ValueHead(hidden_size_of(m), a.value_head_hidden_dim, _param_dtype(m)))
            self.critic_names = []
        if isinstance(metrics_callback, str):
            from comlrl_lightning.data.tasks import resolve_callable as _resolve_callable

            metrics_callback = _resolve_callable(metrics_callback, "metrics_callback")
        if metrics_callback is not None and not callable(metrics_callback):
            raise ValueError(f"metrics_callback must be a callable or None; got {type(metrics_callback).__name__}.")
        self.metrics_callback = metrics_callback
        self.reference = None
        if a.reference_kl_enabled:
            from comlrl_lightning.reference import ReferencePolicies

            self.reference = ReferencePolicies(self.team, a.reference_devices)
        self.streams = [SamplingStream(a.seed * 1_000_003 + 7919 * i + 17) for i in range(n)]
        self._rng = random.Random(a.seed)
        self.buffers: list[list[dict]] = [[] for _ in range(n)]
        self.env_step = 0
        self.updates_seen = 0
        self.num_drains = 0
        self._last_logged_env_step: int | None = None
        self.last_rollouts: list[dict] = []
        self.formatters: list[Callable] | None = None
        self.oracle: Any = None
        #: Reward oracle of *training* rollouts only; None = ``self.oracle`` (the task reward). MARLHF sets a
        #: learned reward here: an object with ``reward_func`` (called like a task reward function) and
        #: ``reward_processor``. :meth:`evaluate` and the evaluation callback keep the task reward.
        self.train_oracle: Any = None
        self.external_transition: Callable | None = None

    # --- setup --------------------------------------------------------------------------------------------
    def _check_critic_vocab(self, critic: nn.Module, tok: Any, k: int) -> None:
        emb = critic.get_input_embeddings() if hasattr(critic, "get_input_embeddings") else None
        size = getattr(emb, "num_embeddings", None)
        if size is not None and len(tok) > size:
            raise ValueError(f"Critic {k} has {size} input embeddings but the tokenizer it reads has {len(tok)} "
                             "tokens: the critic would receive ids it cannot embed. Use a critic with the agents' "
                             "vocabulary.")

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
        dm = getattr(self.trainer, "datamodule", None)
        if dm is None or not hasattr(dm, "oracle") or not hasattr(dm, "formatters"):
            raise ValueError(f"{self.method} needs a task data module with `formatters` and `oracle` "
                             "(comlrl_lightning.data.tasks_dm.TaskDataModule).")
        self.bind_task(dm.formatters, dm.oracle, getattr(dm, "external_transition", None))

    def on_fit_start(self) -> None:
        for m in [*self.team.unique_models(), *self.critics, *self.value_heads]:
            m.train()

    def sampling_settings(self) -> SamplingSettings:
        a = self.args
        return SamplingSettings(a.max_new_tokens, a.temperature, a.top_p, a.top_k)

    def configure_optimizers(self):
        a = self.args
        optimizers = []
        for i in range(self.team.num_agents):
            params = list(self.team.parameters_of(i))
            if self.value_heads:
                params += list(self.value_heads[i].parameters())
            if not params:
                raise ValueError(f"Agent {i} has no trainable parameters.")
            optimizers.append(torch.optim.AdamW(params, lr=a.agent_learning_rate))
        for critic in self.critics:
            optimizers.append(torch.optim.AdamW(critic.trainable_parameters(), lr=a.critic_learning_rate))
        return optimizers

    def _optimizers(self) -> tuple[list, list]:
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        n = self.team.num_agents
        return opts[:n], opts[n:]

    # --- forward passes -----------------------------------------------------------------------------------
    def _ids(self, i: int) -> tuple[int, int]:
        tok = self.team.tokenizers[i]
        eos = tok.eos_token_id if tok.eos_token_id is not None else tok.pad_token_id
        return tok.pad_token_id, eos

    def _sequence_batch(self, i: int, samples: Sequence[dict]) -> tuple[dict, torch.Tensor]:
        """Right-padded [prompt ; completion] rows of agent i with the completion mask, and the critic read
        position of each row (last prompt token for V, last completion token for Q)."""
        pad, eos = self._ids(i)
        prompts = [s["prompt_ids"] for s in samples]
        comps = [trim_completion(s["completion_ids"], eos, pad) for s in samples]
        batch = build_scoring_batch(prompts, comps, pad, drop_last=False)
        q = self.args.critic_type == "q"
        pos = torch.tensor([len(p) - 1 + (len(c) if q else 0) for p, c in zip(prompts, comps)])
        return {k: v.to(self.device) for k, v in batch.items()}, pos.to(self.device)

    def _actor_forward(self, i: int, batch: dict, with_values: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token log-probs ``[R, L]`` of agent i (and its attached head's values ``[R, L]``)."""
        with self.team.activate(i) as model:
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False,
                        output_hidden_states=with_values)
        values = self.value_heads[i](out.hidden_states[-1]) if with_values else None
        return token_logps(out.logits, batch["input_ids"]), values

    def _joint_batch(self, samples: Sequence[dict]) -> tuple[dict, torch.Tensor]:
        ids, mask = _right_pad([s["critic_ids"] for s in samples], self.team.tokenizers[0].pad_token_id)
        pos = torch.tensor([len(s["critic_ids"]) - 1 for s in samples])
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}, pos.to(self.device)

    def _values(self, i: int, samples: Sequence[dict]) -> torch.Tensor:
        """Critic values of agent i's samples (gradients follow the caller's grad mode), ``[R]``."""
        if self.is_maac:
            batch, pos = self._joint_batch(samples)
            values = self.critics[0](batch["input_ids"], batch["attention_mask"])
        else:
            batch, pos = self._sequence_batch(i, samples)
            if self.value_heads:
                values = self._actor_forward(i, batch, with_values=True)[1]
            else:
                values = self.critics[i](batch["input_ids"], batch["attention_mask"])
        return values.gather(1, pos.unsqueeze(1)).squeeze(1)

    # --- rollout (§4.3) -----------------------------------------------------------------------------------
    def _format(self, a: int, item: dict, where: str) -> str:
        fmt = self.formatters[a]
        try:
            text = fmt(item, external_prompts=None) if _declares(fmt, "external_prompts") else fmt(item)
        except KeyError as exc:
            raise ValueError(f"{where}: agent {a}'s formatter needs field {exc.args[0]!r} (item keys: "
                             f"{sorted(item)}).") from exc
        if not isinstance(text, str) or not text:
            raise ValueError(f"Formatter must return a string prompt: agent {a}'s formatter returned {text!r} on "
                             f"{where}.")
        return text

    def _turn_rewards(self, prompts: list[str], texts: list[list[str]], item: dict, where: str, k: int,
                      oracle: Any = None) -> tuple[list[list[float]], float]:
        """One reward call for a turn → (per-agent × per-generation rewards, the termination mean) (§6.3)."""
        n = self.team.num_agents
        oracle = self.oracle if oracle is None else oracle
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
        if n > 1 and len(values) == 1:
            values = values * n
        if not values or (n > 1 and len(values) not in (n, k)):
            raise RewardError(f"Reward function must return either 1 or N values per prompt for multi-agent "
                              f"{self.method}: got {len(values)} values on {where} (N={n}, num_generations={k}).")
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

    @torch.no_grad()
    def _turn_values(self, turn_samples: list[list[dict]]) -> list[list[float]]:
        """Rollout-time critic values V_old (or Q_old) of one turn, ``[agent][generation]``."""
        return [self._values(i, s).float().tolist() for i, s in enumerate(turn_samples)]

    @torch.no_grad()
    def _turn_kls(self, turn_samples: list[list[dict]]) -> list[list[float]]:
        from comlrl_lightning.reference import sequence_kl

        out = []
        for i, samples in enumerate(turn_samples):
            batch, _ = self._sequence_batch(i, samples)
            policy = self._actor_forward(i, batch, with_values=False)[0]
            ref = self.reference.token_logps(i, batch)
            out.append(sequence_kl(policy, ref, batch["score_mask"]).float().tolist())
        return out

    def collect(self, item: dict, item_index: Any = 0, num_generations: int | None = None, oracle: Any = None
                ) -> list[dict]:
        """Roll out one task item (one episode); returns every sample, with TD targets set (§4.3).
        ``oracle`` overrides the bound task oracle for this rollout (training uses ``train_oracle``)."""
        from comlrl_lightning.multiturn.transitions import call_transition, next_prompts

        if self.formatters is None or self.oracle is None:
            raise RuntimeError("No task bound: call bind_task(formatters, oracle, transition) or fit with a "
                               "TaskDataModule.")
        a, n = self.args, self.team.num_agents
        k = a.num_generations if num_generations is None else num_generations
        settings = self.sampling_settings()
        beta = a.reference_kl_coef if self.reference is not None else 0.0
        where = f"task item {item_index}"
        prompts = [self._format(j, item, where) for j in range(n)]
        p_hist: list[list[str]] = [[] for _ in range(n)]
        r_hist: list[list[str]] = [[] for _ in range(n)]
        turns: list[list[list[dict]]] = []  # [turn][agent][generation]
        previous: list[str] = []
        for t in range(a.num_turns):
            if t > 0:
                external = call_transition(self.external_transition, item.get("prompt", ""), previous, n, p_hist,
                                           r_hist, turn=t - 1, branch=item_index)
                prompts = next_prompts(external, item, self.formatters, a.external_prompt_passthrough)
            for j in range(n):
                p_hist[j].append(prompts[j])
            turn: list[list[dict]] = []
            texts: list[list[str]] = []
            for j in range(n):
                with self.team.activate(j) as model:
                    out = sample_completions(model, self.team.tokenizers[j], [prompts[j]], k, settings,
                                             self.streams[j])
                texts.append(out.texts[0])
                turn.append([{"agent": j, "turn": t, "gen": g, "item": item_index, "prompt_ids": out.prompt_ids[0],
                              "completion_ids": out.completion_ids[0][g], "text_len": len(out.texts[0][g])}
                             for g in range(k)])
            rewards, mean_reward = self._turn_rewards(prompts, texts, item, f"{where}, turn {t + 1}", k, oracle)
            if self.is_maac:
                tok0 = self.team.tokenizers[0]
                for g in range(k):
                    acts = [texts[j][g] for j in range(n)] if a.critic_type == "q" else None
                    ids = tok0(joint_critic_text(prompts, acts), truncation=True)["input_ids"]
                    for j in range(n):
                        turn[j][g]["critic_ids"] = ids
            values = self._turn_values(turn)
            kls = self._turn_kls(turn) if self.reference is not None else None
            for j in range(n):
                for g in range(k):
                    s = turn[j][g]
                    s["reward"] = rewards[j][g]
                    s["old_value"] = values[j][g]
                    s["kl"] = kls[j][g] if kls is not None else None
                    s["shaped"] = s["reward"] - (beta * s["kl"] if kls is not None else 0.0)
                r_hist[j].append(texts[j][0])
            previous = [texts[j][0] for j in range(n)]
            turns.append(turn)
            if a.early_termination_threshold is not None and mean_reward > a.early_termination_threshold:
                break
        # TD targets per (agent, generation) trajectory: no bootstrap after the last executed turn.
        samples = []
        for j in range(n):
            for g in range(k):
                traj = [turns[t][j][g] for t in range(len(turns))]
                shaped = torch.tensor([s["shaped"] for s in traj], dtype=torch.float64)
                next_v = torch.tensor([s["old_value"] for s in traj[1:]] + [0.0], dtype=torch.float64)
                targets = td_targets(shaped, next_v, a.discount).tolist()
                returns = torch.flip(torch.cumsum(torch.flip(shaped, [0]), 0), [0]).tolist()
                for s, y, ret in zip(traj, targets, returns):
                    s["target"], s["return"] = float(y), float(ret)
                samples.extend(traj)
        return samples

    @torch.no_grad()
    def evaluate(self, items: Sequence[dict], seed: int = 12345) -> dict[str, float]:
        """AC evaluation (§10.2): one rollout per item with one sample per agent, early termination and KL
        shaping included, on fresh seeded streams (training's streams are untouched).

        Returns ``eval/turn_{t}/reward_mean`` and ``eval/turn_{t}/expected_return`` (means over every agent's
        sample of turn t), the KL means when enabled, and ``eval/reward_mean`` (= turn 1's).
        """
        saved = self.streams
        self.streams = [SamplingStream(seed + 7919 * i) for i in range(self.team.num_agents)]
        per_turn: dict[int, list[dict]] = {}
        try:
            for k, item in enumerate(items):
                for s in self.collect(item, f"eval {k}", num_generations=1):
                    per_turn.setdefault(s["turn"] + 1, []).append(s)
        finally:
            self.streams = saved
        out: dict[str, float] = {}
        for t, samples in sorted(per_turn.items()):
            out[f"eval/turn_{t}/reward_mean"] = sum(s["reward"] for s in samples) / len(samples)
            out[f"eval/turn_{t}/expected_return"] = sum(s["return"] for s in samples) / len(samples)
            if self.reference is not None:
                kl = sum(s["kl"] for s in samples) / len(samples)
                out[f"eval/turn_{t}/reference_kl_mean"] = kl
                out[f"eval/turn_{t}/reference_kl_penalty_mean"] = self.args.reference_kl_coef * kl
        if out:
            out["eval/reward_mean"] = out["eval/turn_1/reward_mean"]
        return out

    # --- training -----------------------------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> None:
        items = batch if isinstance(batch, list) else [batch]
        n = self.team.num_agents
        for entry in items:
            index, item = entry if isinstance(entry, tuple) else (batch_idx, entry)
            rollouts = self.collect(item, index, oracle=self.train_oracle)
            self.last_rollouts = rollouts
            self.env_step += len(rollouts) // n
            for s in rollouts:
                self.buffers[s["agent"]].append(s)
            if self.metrics_callback is not None:
                extra = self.metrics_callback(rollouts) or {}
                clean = {}
                for key, v in extra.items():
                    try:
                        clean[key] = float(v)
                    except (TypeError, ValueError):
                        continue
                self._emit(clean, gate=False)
            self.log("reward", sum(s["reward"] for s in rollouts) / len(rollouts), prog_bar=True, logger=False,
                     batch_size=1)
        ready = [i for i in range(n) if len(self.buffers[i]) >= self.args.rollout_buffer_size]
        if batch_idx + 1 >= self.trainer.num_training_batches:  # the epoch's last batch: flush everything
            ready = [i for i in range(n) if self.buffers[i]]
        if ready:
            self._drain(ready)
        self.updates_seen += 1

    def on_train_epoch_end(self) -> None:
        # Normally flushed by the epoch's last training_step (so its optimizer steps count in global_step);
        # this catches an epoch cut short (max_steps) or a dataloader without a length.
        pending = [i for i in range(self.team.num_agents) if self.buffers[i]]
        if pending:
            self._drain(pending)

    def _drain(self, agents: Sequence[int]) -> None:
        """Update each listed agent on its whole buffer, turn by turn (ascending), then log (§4.4)."""
        metrics: dict[str, float] = {}
        for i in agents:
            samples, self.buffers[i] = self.buffers[i], []
            for t in sorted({s["turn"] for s in samples}):
                metrics.update(self._update(i, [s for s in samples if s["turn"] == t]))
        self.num_drains += 1
        metrics["env_step"] = float(self.env_step)
        self._emit(metrics, gate=True)

    def _update(self, i: int, samples: list[dict]) -> dict[str, float]:
        a = self.args
        actor_opts, critic_opts = self._optimizers()
        targets = torch.tensor([s["target"] for s in samples], dtype=torch.float32, device=self.device)
        old = torch.tensor([s["old_value"] for s in samples], dtype=torch.float32, device=self.device)
        adv = td_advantages(targets, old, normalize=a.advantage_normalization)
        self._check_finite(i, "advantage", adv)
        order = list(range(len(samples)))
        self._rng.shuffle(order)
        actor_losses, value_losses = [], []
        for start in range(0, len(order), a.train_batch_size):
            idx = order[start:start + a.train_batch_size]
            mb = [samples[k] for k in idx]
            idx_t = torch.tensor(idx, device=self.device)
            y, v_old, adv_mb = targets[idx_t], old[idx_t], adv[idx_t]
            batch, pos = self._sequence_batch(i, mb)
            opt = actor_opts[i]
            opt.zero_grad(set_to_none=True)
            logps, head_values = self._actor_forward(i, batch, with_values=bool(self.value_heads))
            actor_loss = policy_gradient_loss(logps, batch["score_mask"], adv_mb)
            self._check_finite(i, "actor loss", actor_loss)
            if self.value_heads:  # IAC attached head: one step on actor + critic loss, with value clipping
                values = head_values.gather(1, pos.unsqueeze(1)).squeeze(1)
                vloss = value_loss(values, y, v_old, a.value_clip_range, a.value_loss_coef).mean()
                self._check_finite(i, "value loss", vloss)
                self.manual_backward(actor_loss + vloss)
                opt.step()
            else:
                self.manual_backward(actor_loss)
                opt.step()
                copt = critic_opts[0 if self.is_maac else i]
                copt.zero_grad(set_to_none=True)
                values = self._values(i, mb)
                vloss = value_loss(values, y, coef=a.value_loss_coef).mean()
                self._check_finite(i, "value loss", vloss)
                self.manual_backward(vloss)
                copt.step()
            actor_losses.append(float(actor_loss.detach()))
            value_losses.append(float(vloss.detach()))
        t = samples[0]["turn"] + 1
        def mean(xs):
            return sum(xs) / len(xs)

        pad, eos = self._ids(i)
        out = {
            f"turn_{t}/reward_mean": mean([s["reward"] for s in samples]),
            f"turn_{t}/expected_return": mean([s["return"] for s in samples]),
            f"train/agent{i}/actor_loss": mean(actor_losses),
            ("train/critic/value_loss" if self.is_maac else f"train/agent{i}/value_loss"): mean(value_losses),
            f"train/agent{i}/completions/mean_length": mean(
                [len(trim_completion(s["completion_ids"], eos, pad)) for s in samples]),
        }
        if self.reference is not None:
            kl = mean([s["kl"] for s in samples])
            out[f"train/agent{i}/kl"] = kl
            out[f"turn_{t}/reference_kl_mean"] = kl
            out[f"turn_{t}/reference_kl_penalty_mean"] = a.reference_kl_coef * kl
        return out

    def _check_finite(self, i: int, what: str, value: torch.Tensor) -> None:
        if not torch.isfinite(value.detach()).all():
            raise FloatingPointError(f"{self.method}: agent {i}'s {what} is not finite ({value.detach().tolist()}). "
                                     "Check the rewards' scale and lower the learning rates.")

    def _emit(self, metrics: dict[str, float], gate: bool) -> None:
        """Log at the current global step, with upstream's env-step gate (``logging_steps``) for train metrics."""
        if not metrics or self._trainer is None:
            return
        if gate:
            last = self._last_logged_env_step
            if self.args.logging_steps > 1 and last is not None and self.env_step - last < self.args.logging_steps:
                return
            self._last_logged_env_step = self.env_step
        log_metrics(self.trainer, metrics)

    # --- checkpoint and export ----------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["comlrl_progress"] = {
            "env_step": self.env_step, "updates_seen": self.updates_seen, "num_drains": self.num_drains,
            "buffers": [[dict(s) for s in b] for b in self.buffers],
            "streams": [s.state_dict() for s in self.streams],
            "shuffle_rng": self._rng.getstate(),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        progress = checkpoint.get("comlrl_progress", {})
        self.env_step = int(progress.get("env_step", 0))
        self.updates_seen = int(progress.get("updates_seen", 0))
        self.num_drains = int(progress.get("num_drains", 0))
        if "buffers" in progress:
            self.buffers = [list(b) for b in progress["buffers"]]
        for s, state in zip(self.streams, progress.get("streams", [])):
            s.load_state_dict(state)
        if "shuffle_rng" in progress:
            state = progress["shuffle_rng"]
            self._rng.setstate((state[0], tuple(state[1]), state[2]))

    def save_agents(self, output_dir: str) -> list[str]:
        """``output_dir/agent_{i}/`` per agent (+ ``value_head.pt`` or ``critic/``); MAAC: ``output_dir/critic/``."""
        paths = self.team.save(output_dir)
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
                 args: IACConfig | None = None, metrics_callback: Callable | str | None = None):
        super().__init__(agent_model, agents, tokenizer, critic_model, critics, critic_model_name, model_config, lora,
                         args if args is not None else IACConfig(), metrics_callback)


class MAACModule(ActorCriticModule):
    """:class:`ActorCriticModule` with a :class:`~comlrl_lightning.config.MAACConfig` (for YAML configs)."""

    def __init__(self, agent_model: str | None = TINY_MODEL_NAME, agents: Sequence[Any] | None = None,
                 tokenizer: Any = None, critic_model: Any = None, critics: Sequence[Any] | None = None,
                 critic_model_name: str | None = None, model_config: dict | None = None, lora: dict | None = None,
                 args: MAACConfig | None = None, metrics_callback: Callable | str | None = None):
        super().__init__(agent_model, agents, tokenizer, critic_model, critics, critic_model_name, model_config, lora,
                         args if args is not None else MAACConfig(), metrics_callback)
