"""Batched sampling of completions, one seeded random stream per purpose.

``sample_completions`` tokenizes the prompts of many task items together (left padding), calls
``generate`` once per chunk with ``num_return_sequences`` candidates per prompt, and returns per item and
candidate the completion token ids trimmed at the first pad token, their length and the decoded text.

Reproducibility: each :class:`SamplingStream` owns a ``torch.Generator``; every ``generate`` call draws a seed
from it. HF ``generate`` itself samples from torch's *global* RNG, which threads share, so the next token is drawn
by :class:`StreamSampler`, a logits processor that applies the sampling warpers (temperature, top-k, top-p, as HF
would), draws from a generator of its own seeded with that value, and leaves HF only the drawn token to pick.
The draws equal those of seeding the global RNG with the same value (:func:`sample_completions` with
``own_generator=False``, the former path; a test checks it), and calls of different agents can run in threads at
the same time (docs/architecture.md, "Devices"). Settings the sampler does not reproduce (beam sampling,
``min_p``, ``typical_p``, ... in ``SamplingSettings.extra`` or the model's generation config,
:func:`uses_own_generator`) fall back to the seeded global RNG. Either way the global RNG is left as it was
(:func:`global_rng_kept`), so streams (agents, comparator, evaluation) never disturb each other or it.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator, Sequence
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
    """Completions for a list of prompts: ``[prompt][candidate]`` ids, lengths and texts.

    ``logprobs``: ``[prompt][candidate][token]`` the engine's log-prob of each completion token under the raw model
    (before temperature and top-k/top-p), aligned with ``completion_ids``; None when the engine cannot report them.
    ``version``: how many weight updates (syncs) of the agent the engine had applied when it sampled; None when
    unknown. ``source``: the saved weights (a snapshot folder) the engine sampled from, None for the weights it
    holds. They serve the weight-sync verification (docs/engines.md, "Verification").
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[list[int]]]
    texts: list[list[str]]
    logprobs: list[list[list[float]]] | None = None
    version: int | None = None
    source: str | None = None


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


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` of ``rows`` padded on the left with ``pad_id`` to the longest row (mask 0
    on padding, 1 on tokens): what ``tokenizer(prompts, padding=True)`` with ``padding_side="left"`` returns for the
    same ids, without tokenizing the prompts a second time."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(list(r), dtype=torch.long)
            mask[i, width - len(r):] = 1
    return {"input_ids": ids, "attention_mask": mask}


def cut_at_pad(row: Sequence[int], pad_id: int | None, eos_id: int | None = None) -> list[int]:
    """Generated ids up to (excluding) the first pad token; the EOS token stays in, also when it equals the pad
    token (``eos_id == pad_id``: the first one is the sampled stop token, the rest padding)."""
    row = list(row)
    if pad_id not in row:
        return row
    cut = row.index(pad_id)
    return row[:cut + 1] if eos_id is not None and eos_id == pad_id else row[:cut]


def _device_of(model: torch.nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


#: Generation settings under which :class:`StreamSampler` would not draw what HF draws (HF adds these warpers or
#: decoding modes after the user's logits processors): with any of them active, sampling uses the global RNG.
_GLOBAL_RNG_SETTINGS = {
    "num_beams": lambda v: v is not None and v > 1,
    "top_h": lambda v: v is not None,
    "min_p": lambda v: v is not None,
    "typical_p": lambda v: v is not None and v < 1.0,
    "epsilon_cutoff": lambda v: v is not None and 0.0 < v < 1.0,
    "eta_cutoff": lambda v: v is not None and 0.0 < v < 1.0,
    "watermarking_config": lambda v: v is not None,
    "renormalize_logits": lambda v: v is True,
    "generation_config": lambda v: v is not None,
    "assistant_model": lambda v: v is not None,
    "prompt_lookup_num_tokens": lambda v: v is not None,
    "custom_generate": lambda v: v is not None,
}


def uses_own_generator(model: Any, settings: SamplingSettings) -> bool:
    """True when :func:`sample_completions` draws ``model``'s tokens with :class:`StreamSampler` (its own
    generator, safe in threads); False when a setting of ``settings.extra`` or of the model's generation config
    (:data:`_GLOBAL_RNG_SETTINGS`) needs HF's own sampling from the seeded global RNG."""
    cfg = getattr(model, "generation_config", None)
    for key, active in _GLOBAL_RNG_SETTINGS.items():
        default = 1 if key == "num_beams" else getattr(cfg, key, None)  # generate_kwargs sets num_beams=1
        value = settings.extra[key] if key in settings.extra else default
        if active(value):
            return False
    return True


class StreamSampler:
    """A logits processor that draws the next token from ``generator``: ``p = softmax(warp(scores))`` with HF's
    sampling warpers in HF's order (temperature, top-k, top-p, from ``gen_kwargs``), ``token ~ multinomial(p,
    generator)``. It returns scores that are 0 at the drawn token and -inf elsewhere, so HF's own draw can only
    pick that token (HF's warpers are switched off, :data:`_NEUTRAL`; ``output_scores`` would show these one-hot
    rows). ``scores``: ``[rows, vocab]``, float32 as HF passes them."""

    def __init__(self, gen_kwargs: dict, generator: torch.Generator):
        from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        self.logprobs: list[torch.Tensor] = []  # per step: [rows] log p(drawn token) under the raw logits
        self.raw: dict[str, torch.Tensor] = {}  # "last": the model's raw logits of this step (a forward hook)
        temperature, top_k, top_p = gen_kwargs.get("temperature"), gen_kwargs.get("top_k"), gen_kwargs.get("top_p")
        self.warpers: list[Any] = []
        if temperature is not None and temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(temperature))
        if top_k is not None and top_k != 0:
            self.warpers.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
        if top_p is not None and top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
        self.generator = generator

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        warped = scores
        for warper in self.warpers:
            warped = warper(input_ids, warped)
        token = torch.multinomial(torch.softmax(warped, dim=-1), num_samples=1, generator=self.generator)
        # the model's own log-prob of the drawn token: its raw logits (before repetition penalties and other
        # processors that transformers applies before this one), else the scores as passed
        raw = self.raw.pop("last", None)
        raw = scores if raw is None or raw.shape != scores.shape else raw.float()
        self.logprobs.append((raw.float().gather(1, token) - torch.logsumexp(raw.float(), -1, keepdim=True))
                             .squeeze(1).cpu())
        return torch.full_like(scores, float("-inf")).scatter_(1, token, 0.0)


#: With :class:`StreamSampler` drawing, the score row HF receives is one-hot: HF's warpers would only filter it again
#: and its own multinomial draw could only pick the same token, so ``generate`` runs in greedy mode (an argmax of that
#: row) with the sampling flags unset; greedy mode takes one sequence per input row, so the prompts are repeated
#: ``num_return_sequences`` times first, as HF does itself. Same tokens, one draw per step instead of two.
_NEUTRAL = {"do_sample": False, "temperature": None, "top_k": None, "top_p": None, "num_return_sequences": 1}

_RNG_LOCK = threading.Lock()
_RNG_KEPT: dict[str, list] = {}  # device -> [users, saved state]


def _rng_state(key: str) -> torch.Tensor:
    return torch.get_rng_state() if key == "cpu" else torch.cuda.get_rng_state(key)


def _set_rng_state(key: str, state: torch.Tensor) -> None:
    if key == "cpu":
        torch.set_rng_state(state)
    else:
        torch.cuda.set_rng_state(state, key)


@contextlib.contextmanager
def global_rng_kept(device: torch.device) -> Iterator[None]:
    """The global RNG of the CPU (and of ``device`` when it is a CUDA device) is restored when the last of the
    calls using it at the same time leaves (``torch.random.fork_rng`` saves and restores per call, which calls
    running in threads at once would interleave)."""
    keys = ["cpu"] + ([str(torch.device("cuda", device.index or 0))] if device.type == "cuda" else [])
    with _RNG_LOCK:
        for key in keys:
            entry = _RNG_KEPT.setdefault(key, [0, None])
            if entry[0] == 0:
                entry[1] = _rng_state(key)
            entry[0] += 1
    try:
        yield
    finally:
        with _RNG_LOCK:
            for key in keys:
                entry = _RNG_KEPT[key]
                entry[0] -= 1
                if entry[0] == 0:
                    _set_rng_state(key, entry[1])
                    del _RNG_KEPT[key]


#: Tokenizers keep state (padding side, the Rust backend's padding settings) that calls in threads would share.
_TOKENIZER_LOCK = threading.RLock()


def generate_kwargs(settings: SamplingSettings, num_candidates: int, pad_id: int | None,
                    eos_id: int | None) -> dict:
    """The keywords of every ``generate`` call: sampling with ``settings`` (``top_k=None`` becomes 0, i.e. off),
    one beam, ``num_candidates`` sequences per prompt, then ``settings.extra`` (``do_sample`` stays True)."""
    kwargs = dict(do_sample=True, temperature=settings.temperature, top_p=settings.top_p, num_beams=1,
                  num_return_sequences=num_candidates, max_new_tokens=settings.max_new_tokens, pad_token_id=pad_id,
                  eos_token_id=eos_id, top_k=0 if settings.top_k is None else settings.top_k)
    kwargs.update({k: v for k, v in settings.extra.items() if k != "do_sample"})
    return kwargs


def _seed_global(device: torch.device, seed: int) -> None:
    """Seed the global RNG that HF's draw uses on ``device`` (the CPU's, or that CUDA device's)."""
    if device.type == "cuda":
        torch.cuda.default_generators[device.index or 0].manual_seed(seed)
    else:
        torch.random.default_generator.manual_seed(seed)


@torch.no_grad()
def sample_completions(
    model: torch.nn.Module,
    tokenizer,
    prompts: Sequence[str],
    num_candidates: int,
    settings: SamplingSettings,
    stream: SamplingStream,
    max_batch_rows: int = 256,
    own_generator: bool | None = None,
) -> Samples:
    """Sample ``num_candidates`` completions for each prompt, batched across prompts.

    Completion ids are the generated tokens up to (excluding) the first pad token; when pad != eos the
    EOS token stays in, as in upstream's generated rows. The model is put in eval mode for sampling and
    its previous mode restored. A prompt longer than the model's context minus ``max_new_tokens``
    (:func:`context_limit`) is cut to its last tokens with a warning (:func:`truncate_prompt_ids`); the
    returned ``prompt_ids`` are the ids actually used.

    Each ``generate`` call (``max_batch_rows`` rows at most) takes one seed from ``stream``. ``own_generator``
    (default :func:`uses_own_generator`): draw tokens with :class:`StreamSampler` from a generator seeded with it,
    which calls in other threads cannot disturb; False: seed the global RNG with it and let HF draw (the same
    tokens; not safe while another thread samples). Calls for different models may run in threads at once (the
    tokenizer is used under a lock).
    """
    if num_candidates < 1:
        raise ValueError(f"num_candidates must be >= 1. Got {num_candidates}.")
    pad_id = tokenizer.pad_token_id
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else pad_id
    device = _device_of(model)
    own = uses_own_generator(model, settings) if own_generator is None else own_generator
    per_chunk = max(1, max_batch_rows // num_candidates)
    with _TOKENIZER_LOCK:
        prompt_ids, _ = encode_prompts(model, tokenizer, prompts, settings.max_new_tokens)
    encs = [left_pad(prompt_ids[i:i + per_chunk], pad_id if pad_id is not None else eos_id)
            for i in range(0, len(prompts), per_chunk)]
    gen_kwargs = generate_kwargs(settings, num_candidates, pad_id, eos_id)
    user_processors = list(gen_kwargs.pop("logits_processor", None) or [])
    generated: list[list[int]] = []
    logprobs: list[list[float]] | None = [] if own else None  # per row, per step (own sampler only)
    was_training = model.training
    model.eval()
    try:
        with global_rng_kept(device):
            for enc in encs:
                enc = {k: v.to(device) for k, v in enc.items()}
                seed = stream.next_seed()
                if own:
                    from transformers import LogitsProcessorList

                    sampler = StreamSampler(gen_kwargs, torch.Generator(device=device).manual_seed(seed))
                    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
                    hook = None if head is None else head.register_forward_hook(
                        lambda _m, _i, logits, raw=sampler.raw: raw.__setitem__("last", logits[:, -1, :].detach()))
                    try:
                        rows = {k: v.repeat_interleave(num_candidates, 0) for k, v in enc.items()}
                        out = model.generate(**rows, **{**gen_kwargs, **_NEUTRAL},
                                             logits_processor=LogitsProcessorList([*user_processors, sampler]))
                    finally:
                        if hook is not None:
                            hook.remove()
                    steps = torch.stack(sampler.logprobs, 1) if sampler.logprobs else torch.zeros(len(out), 0)
                    logprobs += steps.tolist()
                else:
                    _seed_global(device, seed)
                    extra = {"logits_processor": user_processors} if user_processors else {}
                    out = model.generate(**enc, **gen_kwargs, **extra)
                generated += out[:, enc["input_ids"].shape[1]:].tolist()
    finally:
        model.train(was_training)
    completion_ids = [[cut_at_pad(generated[p * num_candidates + c], pad_id, eos_id) for c in range(num_candidates)]
                      for p in range(len(prompts))]
    with _TOKENIZER_LOCK:
        texts = [[tokenizer.decode(ids, skip_special_tokens=True) for ids in rows] for rows in completion_ids]
    row_logprobs = None
    if logprobs is not None:
        row_logprobs = [[logprobs[p * num_candidates + c][:len(completion_ids[p][c])] for c in range(num_candidates)]
                        for p in range(len(prompts))]
    return Samples(prompt_ids=prompt_ids, completion_ids=completion_ids, texts=texts, logprobs=row_logprobs)
