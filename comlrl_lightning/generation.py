"""Batched sampling of completions, one seeded random stream per purpose.

``sample_completions`` tokenizes the prompts of many task items together (left padding), calls
``generate`` once per chunk with ``num_return_sequences`` candidates per prompt, and returns per item and
candidate the completion token ids trimmed at the first pad token, their length and the decoded text.

Reproducibility: HF ``generate`` draws from torch's global RNG. Each :class:`SamplingStream` owns a
``torch.Generator``; a call draws a seed from it, and sampling runs inside ``torch.random.fork_rng`` seeded
with that value, so streams (agents, comparator, evaluation) never disturb each other or the global RNG.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: Above this, ``tokenizer.model_max_length`` is transformers' "no limit" sentinel.
_NO_LIMIT = 10**9


@dataclass
class SamplingSettings:
    """Generation settings shared by collection and evaluation."""

    max_new_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 0.6
    top_k: int | None = 50
    extra: dict = field(default_factory=dict)
    """Further ``generate`` keywords (CoMLRL's ``train(**kwargs)``); ``do_sample`` is always True."""


class SamplingStream:
    """A named, seeded random stream whose state can be saved in a checkpoint (plain tensor)."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(int(seed))

    def next_seed(self) -> int:
        return int(torch.randint(0, 2**62, (1,), generator=self.generator).item())

    def state_dict(self) -> dict:
        return {"rng_state": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["rng_state"])


@dataclass
class Samples:
    """Completions for a list of prompts: ``[prompt][candidate]`` ids, lengths and texts."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[list[int]]]
    texts: list[list[str]]


def context_limit(model: Any, tokenizer: Any) -> int | None:
    """Tokens the model can attend to: ``max_position_embeddings`` (or ``n_positions``) of its config and the
    tokenizer's ``model_max_length``, the smaller one; None when neither is known."""
    cfg = getattr(model, "config", None)
    limits = [getattr(cfg, a, None) for a in ("max_position_embeddings", "n_positions")]
    limits.append(getattr(tokenizer, "model_max_length", None))
    limits = [v for v in limits if isinstance(v, int) and not isinstance(v, bool) and 0 < v < _NO_LIMIT]
    return min(limits) if limits else None


def truncate_prompt_ids(ids: Sequence[int], limit: int | None, what: str = "prompt",
                        keep_first: int | None = None) -> list[int]:
    """``ids`` cut to their last ``limit`` tokens (the end of a prompt holds the question), with a warning; a
    leading ``keep_first`` id (the BOS token) stays in front. ``limit`` None or not exceeded: unchanged."""
    ids = list(ids)
    if limit is None or len(ids) <= limit:
        return ids
    limit = max(1, limit)
    head = [ids[0]] if keep_first is not None and ids and ids[0] == keep_first and limit > 1 else []
    out = head + ids[len(ids) - (limit - len(head)):]
    warnings.warn(f"{what} has {len(ids)} tokens, more than the {limit} the model can take; it was truncated to its "
                  f"last {limit} tokens (docs/preference.md §7.3).", UserWarning, stacklevel=3)
    return out


def encode_prompts(model: Any, tokenizer: Any, prompts: Sequence[str],
                   max_new_tokens: int) -> tuple[list[list[int]], bool]:
    """The prompt ids every engine samples from, and whether any was cut: ``tokenizer(p, add_special_tokens=True)``
    per prompt, cut to the model's context minus ``max_new_tokens`` (:func:`context_limit`,
    :func:`truncate_prompt_ids`, with a warning). An empty prompt is a ``ValueError``."""
    prompt_ids = [tokenizer(p, add_special_tokens=True)["input_ids"] for p in prompts]
    for i, ids in enumerate(prompt_ids):
        if not ids:
            raise ValueError(f"Prompt {i} tokenizes to nothing: {prompts[i]!r}. Prompts must be non-empty.")
    context = context_limit(model, tokenizer)
    budget = None if context is None else max(1, context - max_new_tokens)
    cut = [truncate_prompt_ids(ids, budget, f"Prompt {i}", tokenizer.bos_token_id) for i, ids in enumerate(prompt_ids)]
    return cut, any(len(a) != len(b) for a, b in zip(cut, prompt_ids))


def cut_at_pad(row: Sequence[int], pad_id: int | None) -> list[int]:
    """Generated ids up to (excluding) the first pad token; with pad != eos the EOS token stays in."""
    row = list(row)
    return row[:row.index(pad_id)] if pad_id in row else row


def _device_of(model: torch.nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


@torch.no_grad()
def sample_completions(
    model: torch.nn.Module,
    tokenizer,
    prompts: Sequence[str],
    num_candidates: int,
    settings: SamplingSettings,
    stream: SamplingStream,
    max_batch_rows: int = 256,
) -> Samples:
    """Sample ``num_candidates`` completions for each prompt, batched across prompts.

    Completion ids are the generated tokens up to (excluding) the first pad token; when pad != eos the
    EOS token stays in, as in upstream's generated rows. The model is put in eval mode for sampling and
    its previous mode restored. A prompt longer than the model's context minus ``max_new_tokens``
    (:func:`context_limit`) is cut to its last tokens with a warning (:func:`truncate_prompt_ids`); the
    returned ``prompt_ids`` are the ids actually used.
    """
    if num_candidates < 1:
        raise ValueError(f"num_candidates must be >= 1. Got {num_candidates}.")
    pad_id = tokenizer.pad_token_id
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else pad_id
    device = _device_of(model)
    prompt_ids, truncated = encode_prompts(model, tokenizer, prompts, settings.max_new_tokens)
    completion_ids: list[list[list[int]]] = []
    texts: list[list[str]] = []
    per_chunk = max(1, max_batch_rows // num_candidates)
    was_training = model.training
    model.eval()
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        for start in range(0, len(prompts), per_chunk):
            chunk = list(prompts[start:start + per_chunk])
            if truncated:  # pad the (cut) ids themselves
                enc = tokenizer.pad({"input_ids": prompt_ids[start:start + per_chunk]}, padding=True,
                                    return_tensors="pt").to(device)
            else:
                enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=True).to(device)
            gen_kwargs = dict(
                do_sample=True,
                temperature=settings.temperature,
                top_p=settings.top_p,
                num_beams=1,
                num_return_sequences=num_candidates,
                max_new_tokens=settings.max_new_tokens,
                pad_token_id=pad_id,
                eos_token_id=eos_id,
            )
            if settings.top_k is not None:
                gen_kwargs["top_k"] = settings.top_k
            else:
                gen_kwargs["top_k"] = 0
            gen_kwargs.update({k: v for k, v in settings.extra.items() if k != "do_sample"})
            devices = [device] if device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(stream.next_seed())
                out = model.generate(**enc, **gen_kwargs)
            gen = out[:, enc["input_ids"].shape[1]:].tolist()
            for p in range(len(chunk)):
                rows, row_texts = [], []
                for c in range(num_candidates):
                    ids = cut_at_pad(gen[p * num_candidates + c], pad_id)
                    rows.append(ids)
                    row_texts.append(tokenizer.decode(ids, skip_special_tokens=True))
                completion_ids.append(rows)
                texts.append(row_texts)
    finally:
        tokenizer.padding_side = old_side
        model.train(was_training)
    return Samples(prompt_ids=prompt_ids, completion_ids=completion_ids, texts=texts)
