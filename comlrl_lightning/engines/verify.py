"""Weight-sync verification (docs/engines.md, "Verification"): the checks the RL modules run on what an engine
returns, shared by the MAGRPO family and IAC/MAAC.

* :func:`check_engine_version`: right after sampling, the weight version a :class:`~comlrl_lightning.generation.Samples`
  reports must be the engine's (:func:`engine_weight_version`: every sync it was told about is applied).
* :func:`check_logprob_gap`: on an update's first minibatch, the engine's log-probs of the sampled tokens against
  the trainer's from the forward the update makes anyway.
* :func:`check_comparator_samples`: a comparator's samples come from the weights the comparator stands for (the live
  agents' version, a fixed model's version 0, or the history snapshot folder it picked for the round).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from comlrl_lightning.devices import draws_random_numbers
from comlrl_lightning.generation import Samples
from comlrl_lightning.logprobs import logprob_gap

#: ``logprob_gap_threshold="auto"``: float32 on both sides (healthy gaps measured below 1e-4 on this machine: HF 1e-7,
#: vLLM CPU < 5e-5; one missed update 0.009 (LoRA, lr 1e-3) to 0.18 (full weights)), else lower precision.
FLOAT32_GAP_THRESHOLD = 0.005
LOW_PRECISION_GAP_THRESHOLD = 0.1


def gap_threshold(option: Any, model: torch.nn.Module, engine: Any) -> float | None:
    """The threshold ``logprob_gap_threshold`` means for ``model`` served by ``engine``: a number or None as given;
    "auto": :data:`FLOAT32_GAP_THRESHOLD` when the model's weights and the engine's ``dtype`` (vLLM's
    ``vllm_kwargs``; it defaults to the model's) are float32, else :data:`LOW_PRECISION_GAP_THRESHOLD`; None (no
    check) when the model trains with dropout, whose training-mode forward is not the engine's eval-mode one."""
    if option != "auto":
        return option
    if model.training and draws_random_numbers(model):
        return None
    param = next(model.parameters(), None)
    engine_dtype = str((getattr(engine, "vllm_kwargs", None) or {}).get("dtype", "auto")).removeprefix("torch.")
    float32 = (param is None or param.dtype == torch.float32) and engine_dtype in ("auto", "float32", "float")
    return FLOAT32_GAP_THRESHOLD if float32 else LOW_PRECISION_GAP_THRESHOLD


class EngineSyncError(RuntimeError):
    """The engine sampled with weights other than the trainer's."""


def engine_weight_version(engine: Any, agent: int) -> int | None:
    """The weight version of ``agent`` that ``engine`` was last told about (``engine.weight_version(agent)``: the
    updates sent to it); None for an engine without versions."""
    version = getattr(engine, "weight_version", None)
    return None if version is None else version(agent)


def check_engine_version(engine: Any, agent: int, samples: Samples, step: int) -> None:
    """Raise :class:`EngineSyncError` when ``samples`` report a weight version of ``agent`` other than the one the
    engine was last told about (:func:`engine_weight_version`: a sync that was asked for and not applied).
    Engines or samples without versions are not checked."""
    expected = engine_weight_version(engine, agent)
    if samples.version is None or expected is None or samples.version == expected:
        return
    raise EngineSyncError(
        f"Weight-sync check failed for agent {agent} at optimizer step {step}: the {type(engine).__name__} sampled "
        f"with weights of version {samples.version} (weight updates applied), but the trainer's weights are at "
        f"version {expected} (updates sent to the engine): a weight sync was not applied (docs/engines.md, "
        "\"Verification\").")


def check_logprob_gap(token_logps: torch.Tensor, score_mask: torch.Tensor,
                      engine_logps: Sequence[Sequence[float] | None], versions: Sequence[int], version: int,
                      option: Any, agent: int, step: int, engine: Any, model: torch.nn.Module) -> float | None:
    """The mean |trainer − engine| log-prob per token over the rows sampled by the weights of ``version`` (the
    weights the trainer holds at an update's first minibatch) that carry engine log-probs; None when there are none.

    ``token_logps``/``score_mask`` [R, L] as the update's forward computed them, ``engine_logps[r]`` and
    ``versions[r]`` row r's engine log-probs and policy version. Raises :class:`EngineSyncError` naming the agent,
    the step and the version when the gap exceeds the threshold ``option`` means (:func:`gap_threshold`; None:
    never).
    """
    picked = [r for r, (lp, v) in enumerate(zip(engine_logps, versions)) if lp is not None and v == version]
    if not picked:
        return None
    index = torch.tensor(picked, device=token_logps.device)
    total, count = logprob_gap(token_logps.index_select(0, index), score_mask.index_select(0, index),
                               [engine_logps[r] for r in picked])
    if not count:
        return None
    gap = total / count
    threshold = gap_threshold(option, model, engine)
    if threshold is not None and gap > threshold:
        raise EngineSyncError(
            f"Weight-sync check failed for agent {agent} at optimizer step {step}: the engine's log-probs of the "
            f"tokens it sampled differ from the trainer's by {gap:.4f} nats per token on average "
            f"(logprob_gap_threshold={option!r}: {threshold}), on samples of weight version {version}, the version "
            f"the trainer holds for this agent: the engine ({type(engine).__name__}) sampled with other weights than "
            "the trainer holds. Check the engine's weight sync (docs/engines.md, \"Verification\"), or raise "
            "logprob_gap_threshold if this gap is the numerical difference of a healthy engine.")
    return gap


def check_comparator_samples(policy: str, agent: int, samples: Samples, round_index: int, *,
                             version: int | None = None, source: str | None = None) -> None:
    """Raise :class:`EngineSyncError` when a comparator's samples of slot ``agent`` were drawn from other weights
    than the comparator's: ``version`` is the weight version they must report (``samples.version``: the live agents'
    for ``current``/``current_copy``, 0 for a fixed ``model``), ``source`` the saved folder they must come from
    (``samples.source``: the ``history`` snapshot of the round). What the samples or the comparator leave unknown
    (None) is not checked."""
    wrong = []
    if version is not None and samples.version is not None and samples.version != version:
        wrong.append(f"weight version {samples.version} where the comparator stands for version {version}")
    if source is not None and samples.source is not None and str(samples.source) != str(source):
        wrong.append(f"the snapshot {samples.source} where the comparator picked {source}")
    if wrong:
        raise EngineSyncError(
            f"The {policy!r} comparator's samples of agent {agent} in round {round_index} were drawn from "
            f"{' and '.join(wrong)}: the engine serving it did not apply what the comparator asked for "
            "(docs/engines.md, \"Verification\").")
