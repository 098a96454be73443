"""Frozen reference policies for the reference-KL penalty (docs/multiturn.md §9).

:class:`ReferencePolicies` holds, per agent, a frozen copy of the agent as it was when training started:

* plain agents: a deep copy of each distinct model object (agents sharing one object share one copy), in
  eval mode with ``requires_grad=False``, never registered as a submodule (so it is not checkpointed, not
  moved by Lightning and not optimized);
* LoRA agents (one peft base with one adapter per agent): no copy at all; the reference is the base model,
  computed with the adapter disabled (``model.disable_adapter()``).

Devices: ``reference_devices`` (a string, or a list of 1 or N entries), or by default each agent's own
device at the time of the call (docs/decisions.md, decision 7: never a hard-coded ``cuda:0``).

:func:`sequence_kl` is the k3 estimator summed over the scored tokens (:func:`comlrl_lightning.losses.k3_kl`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from comlrl_lightning.devices import device_of, resolve_devices
from comlrl_lightning.logprobs import scored_token_logps
from comlrl_lightning.logprobs import token_logps as _token_logps
from comlrl_lightning.losses import k3_kl


def resolve_reference_devices(spec: Any, fallback: Sequence[torch.device | str | None], expected: int
                              ) -> list[torch.device | None]:
    """Per-agent reference devices: ``spec`` None → ``fallback`` (None entries mean "the agent's device");
    a string → that device for all; a list of length 1 → broadcast; of length ``expected`` → one each.
    ``"auto"`` means the fallback too. Builds ``torch.device`` objects only (no GPU needed)."""
    if isinstance(spec, (list, tuple)) and not spec:
        raise ValueError("reference_devices must be a non-empty list or 'auto'. Got [].")
    devices = resolve_devices(spec, expected, "reference_devices")
    return devices if devices is not None else [torch.device(d) if d is not None else None for d in fallback]



def freeze(model: nn.Module) -> nn.Module:
    """Eval mode, no gradients: what a reference model is."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class ReferencePolicies:
    """Frozen references of an :class:`~comlrl_lightning.agents.AgentTeam` (built from its current weights).

    Args:
        team: the agents (``models``, ``adapters``, ``activate``).
        devices: ``reference_devices`` spec (None = each agent's device, followed at every call).
    """

    def __init__(self, team: Any, devices: Any = None):
        self.team = team
        n = team.num_agents
        self.devices = resolve_reference_devices(devices, [None] * n, n)
        self.models: list[nn.Module | None] = []
        copies: dict[int, nn.Module] = {}
        for i in range(n):
            if team.adapters[i] is not None:
                self.models.append(None)  # LoRA: the base with the adapter disabled is the reference
                continue
            src = team.models[i]
            if id(src) not in copies:
                copies[id(src)] = freeze(copy.deepcopy(src))
            self.models.append(copies[id(src)])

    def __len__(self) -> int:
        return len(self.models)

    def model_for(self, agent_index: int) -> nn.Module | None:
        """The frozen copy of agent ``agent_index`` (None for LoRA agents, whose reference is the base)."""
        return self.models[agent_index]

    def _target_device(self, i: int) -> torch.device:
        if self.devices[i] is not None:
            return self.devices[i]
        return device_of(self.team.models[i])

    @contextlib.contextmanager
    def _reference_model(self, i: int):
        if self.models[i] is None:
            with self.team.activate(i) as model, model.disable_adapter():
                was_training = model.training
                model.eval()
                try:
                    yield model
                finally:
                    model.train(was_training)
            return
        model = self.models[i]
        device = self._target_device(i)
        if device_of(model) != device:
            model.to(device)
        yield model

    @torch.no_grad()
    def token_logps(self, agent_index: int, batch: dict[str, Tensor]) -> Tensor:
        """Reference log-prob of every input token given the previous ones, ``[R, L]`` (position 0 is 0).

        ``batch`` holds ``input_ids`` and ``attention_mask`` ``[R, L]`` (e.g. from
        :func:`~comlrl_lightning.logprobs.build_scoring_batch`); with its ``score_mask``, only the positions from
        the first scored one on are computed (:func:`~comlrl_lightning.logprobs.scored_token_logps`), the others
        are 0. The result is on the caller's device
        (that of ``batch["input_ids"]``), computed under ``no_grad``.
        """
        out_device = batch["input_ids"].device
        with self._reference_model(agent_index) as model:
            device = device_of(model)
            ids = batch["input_ids"].to(device)
            mask = batch["attention_mask"].to(device)
            if "score_mask" in batch:  # logits of the scored positions only
                return scored_token_logps(model, {"input_ids": ids, "attention_mask": mask,
                                                  "score_mask": batch["score_mask"]})[0].to(out_device)
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            return _token_logps(logits, ids).to(out_device)

    def state_dict(self) -> dict:
        """References are rebuilt from the agents' initial weights; nothing of them is checkpointed here."""
        return {}


def sequence_kl(policy_token_logps: Tensor, ref_token_logps: Tensor, mask: Tensor) -> Tensor:
    """Sequence KL per row, ``Σ_t mask_t · (exp(δ_t) − δ_t − 1)`` with δ = ref − policy (k3, docs/multiturn.md §9).
    ``[R]``.

    All inputs ``[R, L]``; ``mask`` selects the scored completion tokens. The result is detached.
    """
    ref = ref_token_logps.to(policy_token_logps.device)
    return k3_kl(policy_token_logps.detach(), ref.detach(), mask).detach()
