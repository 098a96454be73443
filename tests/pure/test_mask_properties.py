"""Property tests of the loss masks (issue 28, item 3), over random prompts, completions, padding, EOS placement,
pad == eos tokenizers, multi-turn histories and both joint modes.

The token rules (comlrl_lightning/logprobs.py; docs/decisions.md, decisions 3 and 4; docs/preference.md §7.2):

* prompt tokens never carry loss, whatever they hold: template text, environment feedback, other agents' and the
  agent's own earlier completions (with their EOS), pad and EOS ids;
* policy gradient (MAGRPO family, actor-critic actors): every sampled completion token up to and including the
  first EOS is scored, nothing after it; padding never is;
* decentralized MADPO: the completion is cut at its first pad and its last remaining token is not scored;
* centralized collaboration: the full joint completion is scored, its last token included.

Completions enter the builders as the engines return them: the generated row cut at its first pad
(:func:`~comlrl_lightning.generation.cut_at_pad`). A pure stand-in tokenizer (ids only) keeps this file fast.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from comlrl_lightning.generation import Samples, cut_at_pad
from comlrl_lightning.logprobs import (
    build_scoring_batch,
    first_scored_position,
    scored_token_logps,
    token_logps,
    trim_at_pad,
    trim_completion,
)
from comlrl_lightning.modules.actor_critic import ActorCriticModule
from comlrl_lightning.modules.magrpo import completion_batch
from comlrl_lightning.multiturn.tree import AgentDraw, build_trees, node_samples
from comlrl_lightning.preferences import build_offline_pairs

V = 48  # vocabulary of the stand-in tokenizer
FAST = settings(max_examples=200, deadline=None)
FEW = settings(max_examples=40, deadline=None)


# --- strategies -------------------------------------------------------------------------------------------------

@st.composite
def special_ids(draw):
    """(pad, eos): distinct, or equal (a tokenizer whose pad token is its EOS)."""
    pad = draw(st.integers(0, V - 1))
    eos = pad if draw(st.booleans()) else draw(st.integers(0, V - 1).filter(lambda x: x != pad))
    return pad, eos


def any_ids(min_size=0, max_size=12):
    """Any ids: prompts may hold pad and EOS ids anywhere (special-token text, earlier turns' completions)."""
    return st.lists(st.integers(0, V - 1), min_size=min_size, max_size=max_size)


@st.composite
def generated_row(draw, pad, eos):
    """One generated row as ``generate`` returns it, and the tokens policy gradient must score.

    Kinds: stopped at EOS then right-padded up to the batch's longest row (pad ids; with pad == eos the padding
    is more EOS ids); cut by ``max_new_tokens`` (no EOS, and no padding: no row is longer). The body holds no
    special id."""
    body = draw(st.lists(st.integers(0, V - 1).filter(lambda x: x not in (pad, eos)), max_size=10))
    if draw(st.booleans()):
        return body + [eos] + [pad] * draw(st.integers(0, 4)), body + [eos], "eos"
    return body, body, "max_new_tokens"


def pg_expected(body_and_eos, kind, pad, eos):
    """Policy-gradient tokens as implemented: up to and including the first EOS; with pad == eos the engines cut
    the EOS with the padding (generation.cut_at_pad; logprobs.trim_completion), see
    test_pad_eq_eos_policy_gradient_scores_the_eos."""
    return body_and_eos


def history_prompt(draw, pad, eos, turns):
    """A multi-turn prompt: template text, then per earlier turn the agent's own completion, the other agents'
    completions (each with its EOS) and environment feedback; pad/EOS ids may appear anywhere."""
    prompt = draw(any_ids(min_size=1, max_size=6))  # template / task text
    for _ in range(turns):
        for _agent in range(draw(st.integers(1, 3))):
            prompt += draw(any_ids(max_size=5)) + [eos]
        prompt += draw(any_ids(max_size=4))  # environment feedback
    return prompt


def rows_of(batch, r):
    ids, score, att = (batch[k][r].tolist() for k in ("input_ids", "score_mask", "attention_mask"))
    return ids, score, att


def assert_row(batch, r, prompt, scored, pad):
    """Row r is [prompt ; scored ; right padding]: only ``scored`` carries the mask, the prompt and the
    completion are attended, the padding is not."""
    ids, score, att = rows_of(batch, r)
    p, c = len(prompt), len(scored)
    assert ids[:p] == list(prompt) and ids[p:p + c] == list(scored)
    assert score == [0] * p + [1] * c + [0] * (len(ids) - p - c)
    assert sum(att[:p + c]) == p + c and sum(att[p + c:]) == 0
    assert all(x == pad for x in ids[p + c:])


class Tok:
    """The ids a tokenizer exposes to the builders."""

    def __init__(self, pad, eos):
        self.pad_token_id, self.eos_token_id = pad, eos


# --- policy gradient: MAGRPO family and actor-critic actors -------------------------------------------------------

@st.composite
def pg_batch(draw):
    pad, eos = draw(special_ids())
    n = draw(st.integers(1, 5))
    prompts = [history_prompt(draw, pad, eos, draw(st.integers(0, 2))) for _ in range(n)]
    rows = [draw(generated_row(pad, eos)) for _ in range(n)]
    return pad, eos, prompts, rows


@FAST
@given(pg_batch())
def test_policy_gradient_rows_score_exactly_the_sampled_completion_up_to_eos(case):
    pad, eos, prompts, rows = case
    sampled = [cut_at_pad(raw, pad, eos) for raw, _, _ in rows]  # what an engine returns
    expected = [pg_expected(b, kind, pad, eos) for _, b, kind in rows]
    magrpo = completion_batch(prompts, sampled, Tok(pad, eos))
    ac_self = SimpleNamespace(_ids=lambda i: (pad, eos), args=SimpleNamespace(critic_type="v"),
                              agent_device=lambda i: torch.device("cpu"))
    ac, read_at = ActorCriticModule._sequence_batch(ac_self, 0, [{"prompt_ids": p, "completion_ids": c}
                                                                 for p, c in zip(prompts, sampled)])
    for batch in (magrpo, ac):
        for r, (p, exp) in enumerate(zip(prompts, expected)):
            assert_row(batch, r, p, exp, pad)
    assert read_at.tolist() == [len(p) - 1 for p in prompts]  # V reads the last prompt token
    # the generated row itself (with its padding) gives the same rows: padding after EOS never counts
    raw_batch = completion_batch(prompts, [raw for raw, _, _ in rows], Tok(pad, eos))
    assert torch.equal(raw_batch["score_mask"], magrpo["score_mask"])
    assert torch.equal(raw_batch["input_ids"], magrpo["input_ids"])


@FAST
@given(special_ids(), any_ids(max_size=10), any_ids(max_size=6))
def test_nothing_after_the_first_eos_counts(ids, before, after):
    pad, eos = ids
    before = [t for t in before if t not in (pad, eos)]
    kept = trim_completion(before + [eos] + after, eos, pad)
    assert kept == before + [eos]
    assert trim_completion(before, eos, pad) == before  # no EOS: every token is kept


@FAST
@given(any_ids(max_size=12), st.integers(0, V - 1))
def test_trim_at_pad_cuts_at_the_first_pad_only(ids, pad):
    cut = trim_at_pad(ids, pad)
    assert pad not in cut and ids[:len(cut)] == cut
    assert len(cut) == len(ids) or ids[len(cut)] == pad
    assert trim_at_pad(ids, None) == ids


def test_pad_eq_eos_policy_gradient_scores_the_eos():
    pad = eos = 1
    raw = [5, 6, eos, pad, pad]
    batch = completion_batch([[9]], [cut_at_pad(raw, pad, eos)], Tok(pad, eos))
    assert_row(batch, 0, [9], [5, 6, eos], pad)


# --- MADPO pair rows: decentralized (last token dropped) and centralized (full joint completion) -------------------

_DM = {}


def preference_dm(num_agents, score_last_token):
    """A PreferenceDataModule whose collate runs on stand-in tokenizers (built once per configuration)."""
    from comlrl_lightning.data.madpo import PreferenceDataModule

    key = (num_agents, score_last_token)
    if key not in _DM:
        _DM[key] = PreferenceDataModule(num_agents=num_agents, score_last_token=score_last_token,
                                        formatters=[str] * num_agents)
    return _DM[key]


@st.composite
def pair_case(draw):
    pad, eos = draw(special_ids())
    agents = draw(st.integers(1, 3))
    items = draw(st.integers(1, 3))
    cands = draw(st.integers(2, 4))
    samples = []
    for _ in range(agents):
        prompts = [draw(any_ids(min_size=1, max_size=8)) for _ in range(items)]
        comps = [[cut_at_pad(draw(generated_row(pad, eos))[0], pad, eos) for _ in range(cands)] for _ in range(items)]
        samples.append(Samples(prompts, comps, [[f"t{len(c)}" for c in row] for row in comps]))
    rewards = draw(st.lists(st.floats(-1, 1), min_size=items * cands, max_size=items * cands))
    return pad, eos, agents, items, cands, samples, rewards


def pairs_of(case):
    pad, eos, agents, items, cands, samples, rewards = case
    it = iter(rewards)
    table = {(k, j): next(it) for k in range(items) for j in range(cands)}
    calls = {}

    def score(prompts, texts, item, index):
        j = calls.setdefault(index, 0)
        calls[index] += 1
        return table[(index, j)], table[(index, j)]

    pairs, _ = build_offline_pairs([{"prompt": str(k)} for k in range(items)],
                                   [[str(k) for k in range(items)]] * agents, samples, score, "all", None,
                                   random.Random(0))
    return pairs


@FEW
@given(pair_case(), st.booleans())
def test_madpo_pair_rows_follow_the_last_token_rule_exactly(case, centralized):
    """Decentralized: cut at the first pad, the last remaining token unscored (with pad != eos that is the EOS,
    every content token scored). Centralized (score_last_token): every token of the completion scored."""
    pad, eos, agents = case[0], case[1], case[2]
    pairs = pairs_of(case)
    if not pairs:
        return
    dm = preference_dm(agents, centralized)
    dm.tokenizers = [Tok(pad, eos)] * agents
    batch = dm.collate(list(enumerate(pairs)))
    b = len(pairs)
    for a in range(agents):
        rows = batch["agents"][a]
        for i, p in enumerate(pairs):
            for r, comp in ((i, p.winner_token_ids[a]), (b + i, p.loser_token_ids[a])):
                kept = trim_at_pad(comp, pad)
                assert trim_completion(comp, eos, pad) == comp  # the engines already cut at the first pad
                scored = comp if centralized else kept[:-1]
                assert_row(rows, r, p.prompt_token_ids[a], scored, pad)
                if not centralized and pad != eos and kept and kept[-1] == eos:
                    assert scored == [t for t in kept if t != eos]  # exactly the content, never the EOS


def test_pad_eq_eos_centralized_scores_the_eos():
    pad = eos = 1
    comp = cut_at_pad([5, 6, eos, pad], pad, eos)
    samples = [Samples([[9]], [[comp, [7]]], [["a", "b"]])]
    pairs = pairs_of((pad, eos, 1, 1, 2, samples, [1.0, 0.0]))
    dm = preference_dm(1, True)
    dm.tokenizers = [Tok(pad, eos)]
    assert_row(dm.collate(list(enumerate(pairs)))["agents"][0], 0, [9], [5, 6, eos], pad)


@FAST
@given(special_ids(), st.lists(st.tuples(any_ids(min_size=1, max_size=8), any_ids(max_size=8)), min_size=1,
                                max_size=5), st.booleans())
def test_scoring_batch_masks_only_completion_positions(ids, rows, drop_last):
    pad, _ = ids
    prompts, comps = [p for p, _ in rows], [c for _, c in rows]
    batch = build_scoring_batch(prompts, comps, pad, drop_last=drop_last)
    for r, (p, c) in enumerate(rows):
        kept = trim_at_pad(c, pad)
        assert_row(batch, r, p, kept[:-1] if drop_last else kept, pad)


def test_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="empty prompt"):
        build_scoring_batch([[]], [[1, 2]], 0)


# --- multi-turn trees, both joint modes: the rows of every node sample are the draws' ids ---------------------------

@st.composite
def tree_case(draw):
    pad, eos = draw(special_ids())
    return (pad, eos, draw(st.integers(1, 3)), draw(st.integers(2, 3)), draw(st.integers(1, 3)),
            draw(st.sampled_from(["aligned", "cross"])), draw(st.integers(0, 2**31 - 1)))


@FEW
@given(tree_case())
def test_multiturn_trees_train_each_agents_own_sampled_tokens(case):
    """Turn t's prompt holds the template, earlier turns' completions of every agent (EOS included) and
    environment feedback; the rows built for each node sample's loss score exactly that agent's sampled
    completions at that node, in both joint modes."""
    pad, eos, n, k, turns, mode, seed = case
    rng = random.Random(seed)
    content = [t for t in range(V) if t not in (pad, eos)]
    prompt_ids: dict[str, list[int]] = {}
    comp_ids: dict[str, list[int]] = {}
    draws_made: list[tuple[int, AgentDraw]] = []

    def new_prompt(ids):
        key = f"p{len(prompt_ids)}"
        prompt_ids[key] = ids
        return key

    def sample_level(agent, turn, prompts):
        out = []
        for text, used in prompts:
            rows, texts = [], []
            for _ in range(k):
                body = [rng.choice(content) for _ in range(rng.randint(0, 5))]
                raw = body + ([eos] + [pad] * rng.randint(0, 2) if rng.random() < 0.7 else [])
                ids = cut_at_pad(raw, pad, eos)
                key = f"c{len(comp_ids)}"
                comp_ids[key] = ids
                rows.append(ids)
                texts.append(key)
            d = AgentDraw(text, used, prompt_ids[text], rows, texts)
            draws_made.append((agent, d))
            out.append(d)
        return out

    def transition(tree, texts, p_hist, r_hist, turn, path):
        nxt = []
        for _agent in range(n):
            ids = [rng.choice(range(V)) for _ in range(3)]  # template
            for hist in r_hist:  # every agent's completions so far (the other agents' too)
                for t in hist:
                    ids += comp_ids[t]
            ids += [rng.choice(range(V)) for _ in range(rng.randint(0, 3))] + [pad]  # environment feedback
            key = new_prompt(ids)
            nxt.append((key, key))
        return nxt

    roots = [[(new_prompt([rng.choice(range(V)) for _ in range(rng.randint(1, 4))]),) * 2 for _ in range(n)]
             for _ in range(2)]
    trees, _ = build_trees(n, k, turns, mode, roots, sample_level=sample_level, reward=lambda *a: rng.random(),
                           transition=transition if turns > 1 else None)
    samples = [s for root in trees for s in node_samples(root, n, k, "mean", False)]
    assert len(samples) == len(draws_made)
    by_agent = {a: [d for b, d in draws_made if b == a] for a in range(n)}
    for a in range(n):
        mine = [s for s in samples if s.agent == a]
        prompts = [s.prompt_ids for s in mine for _ in s.completion_ids]
        comps = [c for s in mine for c in s.completion_ids]
        batch = completion_batch(prompts, comps, Tok(pad, eos))
        drawn = sorted((tuple(d.prompt_ids), tuple(map(tuple, d.completion_ids))) for d in by_agent[a])
        assert sorted((tuple(s.prompt_ids), tuple(map(tuple, s.completion_ids))) for s in mine) == drawn
        for r, (p, c) in enumerate(zip(prompts, comps)):
            assert_row(batch, r, p, trim_completion(c, eos, pad), pad)


# --- scored log-probs: logits only from the first scored position on, equal on every scored token ------------------

class Bigram(torch.nn.Module):
    """A causal stand-in LM without ``logits_to_keep``: logits at t depend on x_t only."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(V, V)

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        return SimpleNamespace(logits=self.table(input_ids))


@FEW
@given(special_ids(), st.lists(st.tuples(any_ids(min_size=1, max_size=8), any_ids(max_size=6)), min_size=1,
                                max_size=4), st.booleans())
def test_scored_logps_equal_full_logits_on_scored_tokens(ids, rows, drop_last):
    pad, _ = ids
    torch.manual_seed(0)
    model = Bigram()
    batch = build_scoring_batch([p for p, _ in rows], [c for _, c in rows], pad, drop_last=drop_last)
    mask = batch["score_mask"].bool()
    start = first_scored_position(batch["score_mask"])
    scored_rows = [r for r in range(len(rows)) if mask[r].any()]
    assert start == (min(len(rows[r][0]) for r in scored_rows) if scored_rows else batch["input_ids"].shape[1])
    with torch.no_grad():
        fast, _ = scored_token_logps(model, batch)
        full = token_logps(model(batch["input_ids"]).logits, batch["input_ids"])
    assert torch.allclose(fast[mask], full[mask], atol=1e-6)
    assert not fast[:, :max(start, 1)].any()

