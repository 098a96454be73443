"""Prompts that contain the pad or EOS token (issue 28, item 4) are sampled and sliced correctly on the HF engine.

A prompt's special-token text tokenizes to the special id itself, so the prompt ids hold pad/EOS ids at any
position. The engine must (a) attend to them (they are prompt tokens, not padding: only the left padding of the
batch is masked), (b) take the completion as the tokens after the padded prompt width, never from the first pad
id of the prompt (CoMLRL's rule, docs/coming-from-comlrl.md), and (c) hand the loss rows whose teacher-forced
log-probs equal the log-probs the sampler saw. (c) is the strong check: a prompt pad treated as padding at
sampling time, or a completion cut at the wrong place, changes the log-probs.
"""

from __future__ import annotations

import pytest
import torch
from pad_eos_helpers import EOS, PAD, prompts_with

from comlrl_lightning.config.magrpo import MAGRPOConfig
from comlrl_lightning.engines import engine_of
from comlrl_lightning.generation import SamplingSettings, SamplingStream, cut_at_pad
from comlrl_lightning.logprobs import scored_token_logps, trim_at_pad, trim_completion

K = 2
NEW = 6


class Recorder:
    """A logits processor that keeps the raw scores of every step (it runs before the stream sampler)."""

    def __init__(self):
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        self.steps.append(scores.detach().float().clone())
        return scores


@pytest.fixture(params=["pad_ne_eos", "pad_eq_eos"])
def team(request, tiny_model_dir):
    from comlrl_lightning.modules.magrpo import MAGRPOModule

    module = MAGRPOModule(agent_model=tiny_model_dir, args=MAGRPOConfig(num_agents=1, num_generations=K))
    tok = module.team.tokenizers[0]
    if request.param == "pad_eq_eos":
        tok.pad_token = tok.eos_token
    assert (tok.pad_token_id == tok.eos_token_id) == (request.param == "pad_eq_eos")
    return module.team


def sample_spied(team, prompts, seed=0, max_len=None):
    """Sample through the team's HF engine; returns (samples, generate calls, recorded scores)."""
    model, tok = team.models[0], team.tokenizers[0]
    calls = []
    original = model.generate

    def spy(**kw):
        out = original(**kw)
        calls.append({"input_ids": kw["input_ids"].cpu(), "attention_mask": kw["attention_mask"].cpu(),
                      "out": out.cpu()})
        return out

    rec = Recorder()
    settings = SamplingSettings(max_new_tokens=NEW, temperature=1.0, top_p=1.0, top_k=None,
                                extra={"logits_processor": [rec]})
    old_max = tok.model_max_length
    model.generate = spy
    if max_len is not None:
        tok.model_max_length = max_len
    try:
        with pytest.warns(UserWarning, match="truncated") if max_len is not None else _nothing():
            samples = engine_of(team).sample(0, prompts, K, settings, SamplingStream(seed))
    finally:
        model.generate = original
        tok.model_max_length = old_max
    return samples, calls, rec.steps


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def check_slices(team, prompts, samples, calls, expected_prompt_ids):
    tok = team.tokenizers[0]
    pad = tok.pad_token_id
    assert len(calls) == 1
    call = calls[0]
    width = call["input_ids"].shape[1]
    for p, ids in enumerate(expected_prompt_ids):
        assert samples.prompt_ids[p] == ids
        for c in range(K):  # the engine repeats each prompt row K times (greedy mode over the one-hot draw)
            row = p * K + c
            mask = call["attention_mask"][row]
            # every prompt token is attended, pad/EOS ids inside the prompt included; only the left padding is not
            assert int(mask.sum()) == len(ids) and bool(mask[width - len(ids):].all())
            assert call["input_ids"][row, width - len(ids):].tolist() == ids
            assert call["out"][row, :width].tolist() == call["input_ids"][row].tolist()
            # the completion is what generate appended after the padded prompt width, cut at its first pad
            generated = call["out"][row, width:].tolist()
            assert samples.completion_ids[p][c] == cut_at_pad(generated, pad, tok.eos_token_id)
            assert samples.texts[p][c] == tok.decode(samples.completion_ids[p][c], skip_special_tokens=True)


def check_logprobs(team, samples, steps):
    """The rows MAGRPO's loss reads (modules.magrpo.completion_batch) hold [prompt ; sampled completion up to its
    EOS], and their teacher-forced log-probs equal the log-probs of the sampled tokens at sampling time."""
    from comlrl_lightning.modules.magrpo import completion_batch

    model, tok = team.models[0], team.tokenizers[0]
    prompts = [samples.prompt_ids[p] for p in range(len(samples.prompt_ids)) for _ in range(K)]
    comps = [c for cs in samples.completion_ids for c in cs]
    batch = completion_batch(prompts, comps, tok)
    model.eval()
    with torch.no_grad():
        logps, _ = scored_token_logps(model, batch)
    checked = 0
    for r, comp in enumerate(comps):
        start, n = len(prompts[r]), int(batch["score_mask"][r].sum())
        content = trim_at_pad(trim_completion(comp, tok.eos_token_id, tok.pad_token_id), tok.pad_token_id)
        assert len(content) <= n <= len(comp)  # every sampled token up to the EOS, never padding after it
        assert batch["input_ids"][r, :start + n].tolist() == prompts[r] + comp[:n]
        assert batch["score_mask"][r, start:start + n].all() and batch["score_mask"][r].sum() == n
        for t, token in enumerate(comp[:n]):
            sampled = torch.log_softmax(steps[t][r], dim=-1)[token]
            assert abs(float(logps[r, start + t]) - float(sampled)) < 1e-4, (r, t)
            checked += 1
    assert checked > 0
    return batch, logps


def pad_masked_logps(model, batch, pad_id):
    """The log-probs a reader that takes every pad id for padding would get (an attention mask built from the
    ids): the check above must be able to tell it apart."""
    masked = dict(batch, attention_mask=batch["attention_mask"] * (batch["input_ids"] != pad_id).long())
    with torch.no_grad():
        logps, _ = scored_token_logps(model, masked)
    return logps


@pytest.mark.parametrize("special", [PAD, EOS])
def test_special_text_in_prompts_is_sampled_and_sliced_correctly(team, special):
    tok = team.tokenizers[0]
    prompts = prompts_with(special)
    expected = [tok(p, add_special_tokens=True)["input_ids"] for p in prompts]
    special_id = tok.convert_tokens_to_ids(special)
    assert sum(ids.count(special_id) for ids in expected) >= 8  # the ids really are in the prompts
    assert any(ids[0] == special_id for ids in expected) and any(ids[-1] == special_id for ids in expected)
    samples, calls, steps = sample_spied(team, prompts)
    check_slices(team, prompts, samples, calls, expected)
    batch, logps = check_logprobs(team, samples, steps)
    if any(tok.pad_token_id in ids for ids in expected):  # the log-prob check has the power to see a masked pad
        wrong = pad_masked_logps(team.models[0], batch, tok.pad_token_id)
        scored = batch["score_mask"].bool()
        assert float((wrong - logps)[scored].abs().max()) > 1e-3
    # CoMLRL's slice (completion from the prompt's first pad id on) would differ here: the rows are not that slice
    pad = tok.pad_token_id
    for p, ids in enumerate(expected):
        if pad in ids:
            comlrl = ids[ids.index(pad):]
            assert all(c[:len(comlrl)] != comlrl for c in samples.completion_ids[p])


def test_truncated_prompts_with_special_text_keep_their_tail_and_mask(team):
    """A prompt cut to the context (the tokenizer.pad path of sample_completions) keeps its pad/EOS ids as
    attended prompt tokens too."""
    tok = team.tokenizers[0]
    long = f"{PAD} opening words{EOS} that will be cut away by the limit, then {PAD}kept{EOS} tail {PAD}"
    prompts = [long, f"short {EOS}", PAD]
    limit = 20
    full = [tok(p, add_special_tokens=True)["input_ids"] for p in prompts]
    expected = [ids[len(ids) - (limit - NEW):] if len(ids) > limit - NEW else ids for ids in full]
    assert len(full[0]) > limit - NEW and tok.pad_token_id in expected[0]
    samples, calls, steps = sample_spied(team, prompts, seed=3, max_len=limit)
    check_slices(team, prompts, samples, calls, expected)
    check_logprobs(team, samples, steps)


def test_same_prompt_alone_or_next_to_padded_neighbours_gives_the_same_logprobs(team):
    """Left padding from longer neighbours does not change how a prompt full of pad/EOS ids is read: the
    log-probs of its first sampled token are the same alone and in a batch."""
    prompt = f"{PAD}{EOS} a {PAD}"
    alone, _, steps_alone = sample_spied(team, [prompt], seed=1)
    batched, _, steps_batched = sample_spied(team, ["a much longer neighbour prompt to force left padding",
                                                    prompt], seed=1)
    first_alone = torch.log_softmax(steps_alone[0][0], dim=-1)
    first_batched = torch.log_softmax(steps_batched[0][K], dim=-1)
    assert torch.allclose(first_alone, first_batched, atol=1e-4)
    assert alone.prompt_ids[0] == batched.prompt_ids[1]
