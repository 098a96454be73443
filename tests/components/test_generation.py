"""Batched sampling: shapes, one ``generate`` per chunk, seeded streams, global RNG untouched, trimming."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from comlrl_lightning.generation import SamplingSettings, SamplingStream, sample_completions, uses_own_generator

PROMPTS = ["Topic: rivers.", "Topic: bread, cheese and apples.", "Topic: chess."]
# Temperature 1, no top-k / top-p cut: every token stays possible, so different seeds differ.
SETTINGS = SamplingSettings(max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None)


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


class GenerateSpy:
    """Wraps ``model.generate``: records the inputs, kwargs, training flag and raw outputs of every call."""

    def __init__(self, model):
        self.model = model
        self.inner = model.generate
        self.calls: list[dict] = []

    def __call__(self, **kwargs):
        out = self.inner(**kwargs)
        self.calls.append({"kwargs": kwargs, "training": self.model.training, "out": out.clone()})
        return out


def test_shapes_and_texts(model_and_tok):
    model, tok = model_and_tok
    s = sample_completions(model, tok, PROMPTS, 4, SETTINGS, SamplingStream(0))
    assert s.prompt_ids == [tok(p)["input_ids"] for p in PROMPTS]
    assert len(s.completion_ids) == len(s.texts) == 3
    for ids_per_prompt, texts in zip(s.completion_ids, s.texts):
        assert len(ids_per_prompt) == len(texts) == 4
        for ids, text in zip(ids_per_prompt, texts):
            assert len(ids) <= SETTINGS.max_new_tokens
            assert tok.pad_token_id not in ids
            assert text == tok.decode(ids, skip_special_tokens=True)


def test_one_generate_call_per_chunk(model_and_tok, monkeypatch):
    model, tok = model_and_tok
    spy = GenerateSpy(model)
    monkeypatch.setattr(model, "generate", spy)

    # 8 rows per chunk / 4 candidates = 2 prompts per chunk: 3 prompts -> 2 calls (2 prompts, then 1), each prompt
    # row repeated once per candidate (StreamSampler draws; HF takes the argmax of its one-hot row, greedy mode)
    s = sample_completions(model, tok, PROMPTS, 4, SETTINGS, SamplingStream(0), max_batch_rows=8)
    assert [c["kwargs"]["input_ids"].shape[0] for c in spy.calls] == [8, 4]
    assert [c["out"].shape[0] for c in spy.calls] == [8, 4]
    assert len(s.completion_ids) == 3
    first = spy.calls[0]["kwargs"]["input_ids"]
    assert torch.equal(first[0], first[3]) and not torch.equal(first[0], first[4])
    for call in spy.calls:
        kw = call["kwargs"]
        assert kw["do_sample"] is False and kw["num_beams"] == 1 and kw["num_return_sequences"] == 1
        assert kw["max_new_tokens"] == 6
        assert kw["temperature"] is None and kw["top_p"] is None and kw["top_k"] is None  # HF's warpers unset
        assert kw["pad_token_id"] == tok.pad_token_id and kw["eos_token_id"] == tok.eos_token_id

    # Default chunking: everything in one call.
    spy.calls.clear()
    sample_completions(model, tok, PROMPTS, 4, SETTINGS, SamplingStream(0))
    assert len(spy.calls) == 1 and spy.calls[0]["kwargs"]["input_ids"].shape[0] == 3 * 4

    # The draw is StreamSampler's (the last logits processor, with the warpers); HF's own warpers are off.
    spy.calls.clear()
    top_k7 = SamplingSettings(max_new_tokens=3, top_k=7)
    sample_completions(model, tok, PROMPTS, 2, top_k7, SamplingStream(0))
    kw = spy.calls[0]["kwargs"]
    sampler = kw["logits_processor"][-1]
    assert [type(w).__name__ for w in sampler.warpers] == ["TemperatureLogitsWarper", "TopKLogitsWarper",
                                                           "TopPLogitsWarper"]
    assert sampler.warpers[1].top_k == 7 and (kw["top_k"], kw["temperature"], kw["top_p"]) == (None, None, None)
    # The global-RNG path hands the settings to HF, which samples and repeats the rows itself.
    spy.calls.clear()
    sample_completions(model, tok, PROMPTS, 2, top_k7, SamplingStream(0), own_generator=False)
    kw = spy.calls[0]["kwargs"]
    assert kw["top_k"] == 7 and "logits_processor" not in kw and kw["do_sample"] is True
    assert kw["num_return_sequences"] == 2 and kw["input_ids"].shape[0] == 3


def test_completion_ids_follow_the_raw_rows(model_and_tok, monkeypatch):
    """Each completion is the generated part of its row, cut before the first pad, in row order."""
    model, tok = model_and_tok
    spy = GenerateSpy(model)
    monkeypatch.setattr(model, "generate", spy)
    s = sample_completions(model, tok, PROMPTS, 3, SETTINGS, SamplingStream(5))
    (call,) = spy.calls
    width = call["kwargs"]["input_ids"].shape[1]
    rows = call["out"][:, width:].tolist()
    for p in range(3):
        for c in range(3):
            row = rows[p * 3 + c]
            cut = row.index(tok.pad_token_id) if tok.pad_token_id in row else len(row)
            assert s.completion_ids[p][c] == row[:cut]
    # Prompts were left-padded for the batch (the shortest prompt's row starts with padding).
    mask = call["kwargs"]["attention_mask"]
    lengths = [len(ids) for ids in s.prompt_ids]
    shortest = lengths.index(min(lengths))
    assert mask[shortest, 0] == 0 and mask[shortest, -1] == 1


def test_seeded_streams(model_and_tok):
    model, tok = model_and_tok
    a = sample_completions(model, tok, PROMPTS, 4, SETTINGS, SamplingStream(123))
    b = sample_completions(model, tok, PROMPTS, 4, SETTINGS, SamplingStream(123))
    c = sample_completions(model, tok, PROMPTS, 4, SETTINGS, SamplingStream(124))
    assert a.completion_ids == b.completion_ids and a.texts == b.texts
    assert a.completion_ids != c.completion_ids

    # A stream advances: two calls on one stream differ; a saved state replays the second call.
    stream = SamplingStream(9)
    first = sample_completions(model, tok, PROMPTS, 4, SETTINGS, stream)
    state = {k: v.clone() for k, v in stream.state_dict().items()}
    second = sample_completions(model, tok, PROMPTS, 4, SETTINGS, stream)
    assert first.completion_ids != second.completion_ids
    replay = SamplingStream(0)
    replay.load_state_dict(state)
    again = sample_completions(model, tok, PROMPTS, 4, SETTINGS, replay)
    assert again.completion_ids == second.completion_ids


@pytest.mark.parametrize("settings", [SETTINGS, SamplingSettings(max_new_tokens=8),
                                      SamplingSettings(max_new_tokens=8, temperature=0.9, top_p=0.95, top_k=20,
                                                       extra={"repetition_penalty": 1.3})],
                         ids=["plain", "defaults", "penalty"])
def test_own_generator_draws_what_hf_draws_from_the_seeded_global_rng(model_and_tok, settings):
    """StreamSampler (a generator per call, safe in threads) gives the tokens HF's own draw from the global RNG
    seeded with the same stream value gives: moving the draw changed no result."""
    model, tok = model_and_tok
    for seed in range(3):
        own = sample_completions(model, tok, PROMPTS, 4, settings, SamplingStream(seed), own_generator=True)
        hf = sample_completions(model, tok, PROMPTS, 4, settings, SamplingStream(seed), own_generator=False)
        assert (own.prompt_ids, own.completion_ids, own.texts) == (hf.prompt_ids, hf.completion_ids, hf.texts)
        # only the own sampler sees the drawn token with its scores: it alone reports log-probs
        assert hf.logprobs is None and [[len(x) for x in row] for row in own.logprobs] == \
            [[len(c) for c in row] for row in own.completion_ids]


def test_settings_the_sampler_cannot_reproduce_use_the_global_rng(model_and_tok):
    model, tok = model_and_tok
    assert uses_own_generator(model, SETTINGS)
    for extra in ({"min_p": 0.1}, {"num_beams": 2}, {"typical_p": 0.5}, {"renormalize_logits": True}):
        assert not uses_own_generator(model, SamplingSettings(extra=extra)), extra
    assert uses_own_generator(model, SamplingSettings(extra={"typical_p": 1.0, "repetition_penalty": 1.2}))


def test_global_rng_untouched(model_and_tok):
    model, tok = model_and_tok
    torch.manual_seed(2024)
    before = torch.get_rng_state().clone()
    sample_completions(model, tok, PROMPTS, 4, SETTINGS, SamplingStream(1))
    assert torch.equal(torch.get_rng_state(), before)
    # The global stream also does not influence the samples.
    torch.manual_seed(1)
    x = sample_completions(model, tok, PROMPTS, 2, SETTINGS, SamplingStream(77))
    torch.manual_seed(2)
    y = sample_completions(model, tok, PROMPTS, 2, SETTINGS, SamplingStream(77))
    assert x.completion_ids == y.completion_ids


def test_mode_and_padding_side_restored(model_and_tok, monkeypatch):
    model, tok = model_and_tok
    spy = GenerateSpy(model)
    monkeypatch.setattr(model, "generate", spy)
    tok.padding_side = "right"
    try:
        for training in (True, False):
            model.train(training)
            sample_completions(model, tok, PROMPTS[:1], 2, SETTINGS, SamplingStream(0))
            assert spy.calls[-1]["training"] is False  # sampled in eval mode
            assert model.training is training
            assert tok.padding_side == "right"
    finally:
        tok.padding_side = "left"
        model.train()


def test_bad_arguments(model_and_tok):
    model, tok = model_and_tok
    with pytest.raises(ValueError, match="num_candidates must be >= 1"):
        sample_completions(model, tok, PROMPTS, 0, SETTINGS, SamplingStream(0))
    with pytest.raises(ValueError, match="Prompt 1"):
        sample_completions(model, tok, ["Topic: rivers.", ""], 2, SETTINGS, SamplingStream(0))


# --- trimming on hand-made rows -----------------------------------------------------------------------------

class ScriptedLM(nn.Module):
    """A stand-in model whose ``generate`` returns fixed rows after the (padded) prompts."""

    def __init__(self, rows: list[list[int]]):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.rows = rows

    def generate(self, input_ids, attention_mask, num_return_sequences, **kwargs):
        prompts = input_ids.repeat_interleave(num_return_sequences, dim=0)
        return torch.cat([prompts, torch.tensor(self.rows)], dim=1)


def test_trimming_rules(model_and_tok):
    _, tok = model_and_tok
    pad, eos = tok.pad_token_id, tok.eos_token_id
    a, b, c = tok.convert_tokens_to_ids(["T", "o", "p"])
    rows = [
        [a, b, eos, pad, pad],  # EOS kept (pad != eos), padding dropped
        [a, b, c, a, b],        # no pad: the whole row
        [pad, a, b, pad, pad],  # pad first: empty completion
        [c, pad, a, b, c],      # everything after the first pad is dropped
    ]
    s = sample_completions(ScriptedLM(rows), tok, ["Topic: rivers.", "Topic: chess."], 2, SETTINGS,
                           SamplingStream(0))
    assert s.completion_ids == [[[a, b, eos], [a, b, c, a, b]], [[], [c]]]
    assert s.texts[0][0] == tok.decode([a, b], skip_special_tokens=False)  # the EOS is not in the text
    assert s.texts[1][0] == ""
    for ids_row, text_row in zip(s.completion_ids, s.texts):
        for ids, text in zip(ids_row, text_row):
            assert text == tok.decode(ids, skip_special_tokens=True)


def test_a_500kb_prompt_is_truncated_with_a_warning(tiny_model_dir):
    """Issue 14, finding 10: a huge prompt is cut to the model's context (minus max_new_tokens) with a warning,
    instead of running for minutes."""
    import time

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comlrl_lightning.generation import SamplingSettings, SamplingStream, context_limit, sample_completions

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    huge = ("lorem ipsum dolor sit amet " * 20_000)[:500_000] + " Topic: rivers."
    settings = SamplingSettings(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None)
    start = time.monotonic()
    with pytest.warns(UserWarning, match="Prompt 1 has .* tokens.*truncated to its last"):
        s = sample_completions(model, tok, ["Topic: sea.", huge], 2, settings, SamplingStream(0))
    assert time.monotonic() - start < 60
    limit = context_limit(model, tok)
    assert len(s.prompt_ids[1]) == limit - 4
    assert tok.decode(s.prompt_ids[1]).endswith("Topic: rivers.")  # the end of the prompt is kept
    assert s.prompt_ids[0] == tok("Topic: sea.")["input_ids"] and len(s.texts[1]) == 2


def test_left_pad_equals_the_tokenizers_left_padding(model_and_tok):
    """sample_completions pads the ids it already has (``left_pad``) instead of tokenizing the prompts again: the
    same ids and mask as the tokenizer's own left padding, for prompts of different lengths."""
    from comlrl_lightning.generation import left_pad

    _, tok = model_and_tok
    old = tok.padding_side
    tok.padding_side = "left"
    try:
        ref = tok(PROMPTS, padding=True, return_tensors="pt")
    finally:
        tok.padding_side = old
    got = left_pad([tok(p)["input_ids"] for p in PROMPTS], tok.pad_token_id)
    assert len({len(tok(p)["input_ids"]) for p in PROMPTS}) > 1  # padding is exercised
    assert torch.equal(got["input_ids"], ref["input_ids"])
    assert torch.equal(got["attention_mask"], ref["attention_mask"])
