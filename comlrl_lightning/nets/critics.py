"""Critic networks of IAC/MAAC: value heads on causal-LM backbones, critic sources and loading.

A critic maps a token sequence to one value per position, ``[B, L] → [B, L]``; the actor-critic module
reads it at one position per row (V: the last prompt token; Q: the last completion token; MAAC: the last
token of the joint text). Three shapes:

* :class:`ValueHead` on an actor's last hidden states (IAC with ``use_separate_critic=False``);
* :class:`ValueCritic`, a separate backbone plus head (IAC separate critics, one per agent);
* the same :class:`ValueCritic` reading :func:`joint_critic_text` (MAAC's one centralised critic).

Nothing here trains or samples; no Lightning import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from comlrl_lightning.agents import load_model, model_name_of
from comlrl_lightning.tiny import TINY_MODEL_NAME


def hidden_size_of(model: nn.Module) -> int:
    """Hidden width of a causal LM (``config.hidden_size`` or ``config.n_embd``)."""
    cfg = getattr(model, "config", None)
    for attr in ("hidden_size", "n_embd"):
        value = getattr(cfg, attr, None)
        if value:
            return int(value)
    raise ValueError(f"Cannot attach a value head to {type(model).__name__}: its config has neither hidden_size "
                     "nor n_embd.")


def param_dtype(model: nn.Module) -> torch.dtype:
    """Dtype of the model's first parameter (a head is built in the backbone's dtype)."""
    return next(model.parameters()).dtype


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


class ValueCritic(nn.Module):
    """A causal-LM backbone with a value head: the value at every position, ``[B, L]``.

    Only the transformer body runs (``model.base_model`` when it is a distinct submodule), so the LM head
    costs nothing and an untied LM head stays out of the critic's optimizer.
    """

    def __init__(self, model: nn.Module, hidden_dim: int | None = None):
        super().__init__()
        self.model = model
        self.value_head = ValueHead(hidden_size_of(model), hidden_dim, param_dtype(model))

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


def joint_critic_text(prompts: Sequence[str], completions: Sequence[str] | None = None) -> str:
    """MAAC critic input: "[Agent i] prompt_i" blocks; for Q also "[Joint Action]" and the actions."""
    blocks = [f"[Agent {i}] {p}" for i, p in enumerate(prompts)]
    if completions is not None:
        blocks.append("[Joint Action]")
        blocks += [f"[Agent {i} action]\n{c}" for i, c in enumerate(completions)]
    return "\n\n".join(blocks)


def right_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows → right-padded ``input_ids`` and ``attention_mask``, both ``[R, max_len]``."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, r in enumerate(rows):
        ids[k, : len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[k, : len(r)] = 1
    return ids, mask


def resolve_critic_sources(critic_model: Any, critics: Sequence[Any] | None, critic_model_name: str | None,
                           agent_model: Any, agents: Sequence[Any] | None, count: int, method: str) -> list[Any]:
    """Critic sources, first found wins: ``critics`` → ``critic_model`` → ``critic_model_name`` → the agents'
    source when it is a string (IAC: agent i's string for critic i)."""
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


def critic_load_config(model_config: dict | None) -> dict:
    """The agents' load kwargs for a critic: ``critic_model_kwargs`` replace ``model_kwargs``."""
    cfg = {k: v for k, v in dict(model_config or {}).items()
           if k not in ("model_kwargs", "critic_model_kwargs", "special_tokens", "critic_value_head_hidden_dim")}
    cfg["model_kwargs"] = dict((model_config or {}).get("critic_model_kwargs") or {})
    return cfg


def load_critic_backbones(sources: Sequence[Any], model_config: dict | None) -> list[nn.Module]:
    """Load each source (id or path) or take it as is (a torch module); all in train mode."""
    out = []
    for s in sources:
        if isinstance(s, str):
            out.append(load_model(s, critic_load_config(model_config)))
        elif isinstance(s, nn.Module):
            out.append(s)
        else:
            raise TypeError(f"critic sources must be model ids, paths or torch modules; got {type(s).__name__}.")
    for m in out:
        m.train()
    return out


def check_critic_vocab(critic: nn.Module, tokenizer: Any, index: int) -> None:
    """Raise when the critic cannot embed every id of the tokenizer it reads."""
    emb = critic.get_input_embeddings() if hasattr(critic, "get_input_embeddings") else None
    size = getattr(emb, "num_embeddings", None)
    if size is not None and len(tokenizer) > size:
        raise ValueError(f"Critic {index} has {size} input embeddings but the tokenizer it reads has {len(tokenizer)} "
                         "tokens: the critic would receive ids it cannot embed. Use a critic with the agents' "
                         "vocabulary.")


def build_critics(method: str, separate: bool, team: Any, agent_model: Any, agents: Sequence[Any] | None,
                  critic_model: Any, critics: Sequence[Any] | None, critic_model_name: str | None,
                  model_config: dict | None, critic_head_dim: int | None, value_head_dim: int | None
                  ) -> tuple[list[ValueCritic], list[ValueHead], list[str]]:
    """The critics of an actor-critic team: ``(separate critics, attached value heads, critic names)``.

    ``separate`` (MAAC, or IAC with ``use_separate_critic``): one :class:`ValueCritic` per agent (IAC) or one
    in all (MAAC, reading agent 0's tokens), heads of width ``critic_head_dim``. Otherwise one
    :class:`ValueHead` of width ``value_head_dim`` per agent model, and no critic source may be given.
    """
    maac = method == "MAAC"
    if not separate:
        if critic_model is not None or critics is not None or critic_model_name is not None:
            raise ValueError("critics can only be provided when use_separate_critic=True (the value heads sit "
                             "on the actors). Drop critic_model/critics or set use_separate_critic=True.")
        heads = [ValueHead(hidden_size_of(m), value_head_dim, param_dtype(m)) for m in team.models]
        return [], heads, []
    count = 1 if maac else team.num_agents
    sources = resolve_critic_sources(critic_model, critics, critic_model_name, agent_model, agents, count, method)
    out = []
    for k, backbone in enumerate(load_critic_backbones(sources, model_config)):
        check_critic_vocab(backbone, team.tokenizers[0 if maac else k], k)
        out.append(ValueCritic(backbone, critic_head_dim))
    return out, [], [s if isinstance(s, str) else model_name_of(s) for s in sources]
