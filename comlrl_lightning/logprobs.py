"""Masked sequence log-probs: the spec's token rules live here, once.

Decentralized MADPO scoring (docs/preference.md §7.2, docs/decisions.md, decision 3): the completion is trimmed at its
first pad token, and its **last** token is not scored (when pad != eos that is the EOS; for re-tokenized text it
is the last content token). Every other completion token t_k is scored by log p(t_k | prompt, t_<k);
prompt and padding positions never count.

Rows are right-padded so that one forward pass scores winners and losers of all pairs together.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
import torch.nn.functional as F


def trim_at_pad(ids: Sequence[int], pad_id: int | None) -> list[int]:
    """Token ids up to (excluding) the first ``pad_id``."""
    ids = list(ids)
    if pad_id is not None and pad_id in ids:
        return ids[: ids.index(pad_id)]
    return ids


def trim_completion(ids: Sequence[int], eos_id: int | None, pad_id: int | None) -> list[int]:
    """Policy-gradient completion tokens (docs/decisions.md, decision 4): up to (including) the first EOS and up to
    (excluding) the first pad; nothing after the first EOS counts. When pad == eos the first one is the sampled EOS
    and counts; the ones after it are padding."""
    ids = list(ids)
    if eos_id is not None and eos_id in ids:
        ids = ids[: ids.index(eos_id) + 1]
        return ids if eos_id == pad_id else trim_at_pad(ids, pad_id)
    return trim_at_pad(ids, pad_id)


def build_scoring_batch(
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    pad_id: int,
    drop_last: bool = True,
    eos_id: int | None = None,
) -> dict[str, torch.Tensor]:
    """Right-padded rows ``[prompt ; completion]`` with a mask of the scored completion positions.

    ``drop_last`` (decentralized MADPO, docs/decisions.md, decision 3): c is the completion cut at its first pad
    (with pad == eos the EOS goes with it) and its last token is not scored. Otherwise (policy gradient, centralized
    scoring) c is :func:`trim_completion` with ``eos_id``: every token up to and including the first EOS, an EOS
    equal to pad included. For row r with prompt length P and c of length C, the scored tokens are
    c[0 .. C-2] when ``drop_last`` (c[0 .. C-1] otherwise), i.e. input positions P .. P+C-2.
    Returns ``input_ids`` [R, L], ``attention_mask`` [R, L] and ``score_mask`` [R, L] (1 where the token at
    that position is scored).
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError("prompt_ids and completion_ids must have the same number of rows")
    rows, masks = [], []
    for p, c in zip(prompt_ids, completion_ids):
        c = trim_at_pad(c, pad_id)[:-1] if drop_last else trim_completion(c, eos_id, pad_id)
        if not p:
            raise ValueError("a scoring row has an empty prompt; every row needs at least one prompt token")
        rows.append(list(p) + c)
        masks.append([0] * len(p) + [1] * len(c))
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    score = torch.zeros((len(rows), width), dtype=torch.long)
    for r, (row, m) in enumerate(zip(rows, masks)):
        input_ids[r, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention[r, : len(row)] = 1
        score[r, : len(row)] = torch.tensor(m, dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention, "score_mask": score}


def token_logps(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each input token under the logits of the previous position.

    ``logits`` [R, L, V], ``input_ids`` [R, L] → [R, L] with position 0 set to 0 (nothing predicts it).
    Computed in float32.
    """
    return _logps_from(logits, input_ids, 1)


def _logps_from(logits: torch.Tensor, input_ids: torch.Tensor, start: int) -> torch.Tensor:
    """``logits`` [R, L − start + 1, V] of positions start−1 .. L−1 → log p(x_t | x_<t) for t >= start, as [R, L]
    with 0 before ``start``: log p(x) = logit[x] − logsumexp(logits), in float32 (no full-vocabulary log-softmax
    tensor is kept for backward)."""
    shifted = logits[:, :-1].float()
    picked = shifted.gather(-1, input_ids[:, start:].unsqueeze(-1)).squeeze(-1)
    gathered = picked - torch.logsumexp(shifted, dim=-1)
    return F.pad(gathered, (start, 0), value=0.0)


def first_scored_position(score_mask: torch.Tensor) -> int:
    """The smallest position scored in any row of ``score_mask`` [R, L] (L when nothing is scored)."""
    scored = score_mask.bool()
    rows = scored.any(dim=-1)
    if not bool(rows.any()):
        return score_mask.shape[1]
    return int(scored.int().argmax(dim=-1)[rows].min())


def scored_token_logps(model: torch.nn.Module, batch: dict[str, torch.Tensor], **forward_kwargs) -> tuple[
        torch.Tensor, object]:
    """One forward of ``model`` over a :func:`build_scoring_batch` batch that computes logits only where a scored
    token is predicted; returns (token log-probs ``[R, L]``, the model output).

    With s the first scored position of any row (:func:`first_scored_position`), the logits of positions
    s−1 .. L−1 are computed (``logits_to_keep = L − s + 1``, which transformers' causal LMs take; other models
    compute them all and are sliced) and entry t of the result is log p(x_t | x_<t) for t >= s, 0 before. On the
    scored positions it equals :func:`token_logps` of the full logits; the prompt positions before s cost no
    vocabulary projection, no log-sum-exp and no backward through them.
    """
    ids = batch["input_ids"]
    start = max(1, first_scored_position(batch["score_mask"]))
    keep = ids.shape[1] - start + 1
    kwargs = {"input_ids": ids, "attention_mask": batch["attention_mask"], "use_cache": False, **forward_kwargs}
    if accepts_logits_to_keep(model):
        out = model(**kwargs, logits_to_keep=keep)
        logits = out.logits
    else:
        out = model(**kwargs)
        logits = out.logits[:, start - 1:]
    return _logps_from(logits, ids, start), out


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model.forward`` (a peft model: its base model's) takes transformers' ``logits_to_keep``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


def masked_sequence_logps(logits: torch.Tensor, input_ids: torch.Tensor, score_mask: torch.Tensor) -> torch.Tensor:
    """Sum over the scored positions: log π(completion) = Σ_t mask_t · log p(x_t | x_<t). Returns [R]."""
    per_token = token_logps(logits, input_ids)
    return (per_token * score_mask.to(per_token.dtype)).sum(-1)


def sequence_logps(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """One forward pass of ``model`` over a :func:`build_scoring_batch` batch → summed log-probs [R]
    (logits of the scored positions only: :func:`scored_token_logps`)."""
    per_token, _ = scored_token_logps(model, batch)
    return (per_token * batch["score_mask"].to(per_token.dtype)).sum(-1)


def logprob_gap(token_logps: torch.Tensor, score_mask: torch.Tensor, engine_logps: Sequence[Sequence[float]]
                ) -> tuple[float, int]:
    """Σ |log π_trainer(t) − log π_engine(t)| over the scored tokens of every row, and their count.

    ``token_logps`` [R, L] and ``score_mask`` [R, L] as :func:`build_scoring_batch` lays them out (row r's scored
    positions are contiguous and in completion order); ``engine_logps[r]`` the engine's log-probs of row r's
    completion tokens from the first one on (only the first ``score_mask[r].sum()`` are used). The mean gap is
    the sum over the count (docs/engines.md, "Verification").
    """
    total, count = 0.0, 0
    for r, engine in enumerate(engine_logps):
        mine = token_logps[r][score_mask[r].bool()].detach().float().cpu()
        n = min(len(mine), len(engine))
        if n:
            total += float((mine[:n] - torch.tensor(list(engine[:n]), dtype=torch.float32)).abs().sum())
            count += n
    return total, count
